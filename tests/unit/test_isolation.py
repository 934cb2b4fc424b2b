"""--isolate: a crashing or hanging kernel costs only its own case; the sweep goes on."""

import json
import time

import pytest
from reliability_helpers import PLUGINS, TINY, attnbench, query

from attnbench.isolate import crash_line, describe_exit
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig


def test_crashes_and_hangs_become_error_records_and_the_sweep_continues(tmp_path):
    # 8 s, not less: a fresh worker's first case (imports, first kernels) took over 1.5 s on a busy 2-core host
    db = tmp_path / "r.db"
    t0 = time.perf_counter()
    res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive,test-nullread,test-hang,test-sleep",
                    "--case-timeout", "8", "--db", str(db), "--output", str(tmp_path / "out.json"))
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    rows = dict((r[0], r[1:]) for r in query(db, "SELECT backend, status, reason FROM records"))
    assert rows["naive"][0] == "ok" and rows["test-sleep"][0] == "ok"  # before and after the crashes
    assert rows["test-nullread"] == ("error", "worker died with signal 11 (SIGSEGV): Fatal Python error: "
                                              "Segmentation fault")
    assert "Current thread" not in res.stderr and "File " not in res.stderr, res.stderr  # no stack as is
    assert rows["test-hang"] == ("error", "timed out after 8 s")
    assert query(db, "SELECT status FROM runs") == [("done",)]
    assert len(json.loads((tmp_path / "out.json").read_text())) == 4
    assert elapsed < 120  # the hang (3600 s) was cut short


def test_results_match_an_in_process_run(tmp_path):
    db = tmp_path / "r.db"
    for flag in ([], ["--isolate"]):
        res = attnbench("run", *TINY, "--seq-lens", "17", "33,9", "--backends", "naive,sdpa-flash", *flag,
                        "--db", str(db))
        assert res.returncode == 0, res.stderr
    runs = [r[0] for r in query(db, "SELECT run_id FROM runs ORDER BY created_at")]
    cases = [query(db, "SELECT case_id, status, reason, flops FROM records WHERE run_id=? ORDER BY id", r) for r in runs]
    assert cases[0] == cases[1] and len(cases[0]) == 4
    assert {c[1] for c in cases[0]} == {"ok", "unsupported"}


def test_crash_line_picks_the_reason_out_of_a_stack():
    stack = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
             '  File "/x/kernel.py", line 3 in run\n\nExtension modules: numpy.core (total: 12)\n')
    assert crash_line(stack) == "Fatal Python error: Segmentation fault"
    assert crash_line("warming up\nCUDA error: an illegal memory access was encountered\n") == (
        "CUDA error: an illegal memory access was encountered")
    assert crash_line("") == "" and len(crash_line("x" * 1000)) == 200


@pytest.mark.parametrize("code, text", [(-11, "worker died with signal 11 (SIGSEGV)"),
                                        (-6, "worker died with signal 6 (SIGABRT)"),
                                        (3, "worker exited with status 3")])
def test_exit_descriptions(code, text):
    assert describe_exit(code) == text


def test_a_lost_device_context_costs_one_case_and_the_rest_run_in_workers(monkeypatch):
    """After an illegal memory access every CUDA call in the process fails: the sweep goes on in workers."""
    monkeypatch.syspath_prepend(PLUGINS)
    monkeypatch.setenv("PYTHONPATH", PLUGINS)
    monkeypatch.setenv("ATTNBENCH_PLUGINS", "attnbench_test_backends")
    import attnbench_test_backends as plugin

    monkeypatch.setattr(plugin.ContextLoss, "LOST", False)
    monkeypatch.setattr(Runner, "_context_lost", lambda self: plugin.ContextLoss.LOST)
    in_process = []
    run_case = Runner.run_case
    monkeypatch.setattr(Runner, "run_case", lambda self, spec, backend, *a, **k: (
        in_process.append(backend.name), run_case(self, spec, backend, *a, **k))[1])
    specs = [AttnSpec(seqlens_q=(s,), heads_q=1, head_dim=8, dtype="fp32") for s in (17, 33)]
    options = RunOptions(device="cpu", backends=("naive", "test-context-loss", "sdpa-math"),
                         timing=TimingConfig(warmup=0, repeat=1))
    stored = []
    Runner(options, run_id="r", env_id=None, sink=stored.append).run(specs)
    assert [(r.backend, r.spec.seqlens_q[0], r.status) for r in stored] == [
        ("naive", 17, "ok"), ("test-context-loss", 17, "error"), ("sdpa-math", 17, "ok"),
        ("naive", 33, "ok"), ("test-context-loss", 33, "error"), ("sdpa-math", 33, "ok")]
    assert "illegal memory access" in stored[1].reason and "CUDA context unusable" in stored[1].reason
    assert in_process == ["naive", "test-context-loss"]  # nothing more ran in the lost process

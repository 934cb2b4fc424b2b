"""--isolate: a crashing or hanging kernel costs only its own case; the sweep goes on."""

import json
import time

import pytest
from reliability_helpers import TINY, attnbench, query

from attnbench.isolate import describe_exit


def test_crashes_and_hangs_become_error_records_and_the_sweep_continues(tmp_path):
    db = tmp_path / "r.db"
    t0 = time.perf_counter()
    res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive,test-nullread,test-hang,test-sleep",
                    "--case-timeout", "1.5", "--db", str(db), "--output", str(tmp_path / "out.json"))
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    rows = dict((r[0], r[1:]) for r in query(db, "SELECT backend, status, reason FROM records"))
    assert rows["naive"][0] == "ok" and rows["test-sleep"][0] == "ok"  # before and after the crashes
    assert rows["test-nullread"] == ("error", "worker died with signal 11 (SIGSEGV)")
    assert rows["test-hang"] == ("error", "timed out after 1.5 s")
    assert query(db, "SELECT status FROM runs") == [("done",)]
    assert len(json.loads((tmp_path / "out.json").read_text())) == 4
    assert elapsed < 120  # the hang (3600 s) was cut short


def test_results_match_an_in_process_run(tmp_path):
    db = tmp_path / "r.db"
    for flag in ([], ["--isolate"]):
        res = attnbench("run", *TINY, "--seq-lens", "17", "33,9", "--backends", "naive,sdpa-math", *flag,
                        "--db", str(db))
        assert res.returncode == 0, res.stderr
    runs = [r[0] for r in query(db, "SELECT run_id FROM runs ORDER BY created_at")]
    cases = [query(db, "SELECT case_id, status, reason, flops FROM records WHERE run_id=? ORDER BY id", r) for r in runs]
    assert cases[0] == cases[1] and len(cases[0]) == 4
    assert {c[1] for c in cases[0]} == {"ok", "unsupported"}


@pytest.mark.parametrize("code, text", [(-11, "worker died with signal 11 (SIGSEGV)"),
                                        (-6, "worker died with signal 6 (SIGABRT)"),
                                        (3, "worker exited with status 3")])
def test_exit_descriptions(code, text):
    assert describe_exit(code) == text

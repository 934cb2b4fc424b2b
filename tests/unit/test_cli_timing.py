"""--timing / --profiler / --trace / --cooldown on the command line (in-process: fast)."""

import json
import sqlite3

import pytest

from attnbench.cli import main

SMALL = ["run", "--device", "cpu", "--seq-lens", "17", "--q-heads", "2", "--head-size", "8", "--dtype", "fp32",
         "--backends", "naive", "--pass", "fwd", "--no-causal", "--repeat", "3", "--quiet"]


def _run(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


@pytest.mark.parametrize("args, needle", [
    (["--timing", "warm"], "bad --timing 'warm'"),
    (["--profiler", "vtune"], "bad --profiler 'vtune'"),
    (["--timing", "graph"], "needs a CUDA/ROCm device"),
    (["--timing", "profiler"], "needs a CUDA/ROCm device"),
    (["--profiler", "torch"], "needs a CUDA/ROCm device"),
    (["--timing", "graph", "--profiler", "torch"], "cannot be combined"),
    (["--profiler", "nsys"], "nsys"),
    (["--min-time-ms", "-5"], "--min-time-ms"),
    (["--cooldown", "-1"], "--cooldown"),
    (["--ci-target", "-1"], "--ci-target"),
    (["--idle-ratio", "inf"], "--idle-ratio"),
    (["--min-time-ms", "lots"], "min-time-ms"),
    (["--threads", "0"], "bad --threads 0"),
    (["--threads", "many"], "--threads"),
])
def test_bad_timing_options_one_line_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no profiler installed, whatever this machine has
    db = tmp_path / "r.db"
    code, _, err = _run(["run", "--device", "cpu", "--db", str(db), *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnbench") and needle in lines[0], err
    assert not db.exists()


def test_a_cpu_run_records_the_threads_given(tmp_path, capsys):
    import torch
    before = torch.get_num_threads()
    try:
        code, _, err = _run([*SMALL, "--db", str(tmp_path / "r.db"), "--threads", "1"], capsys)
    finally:
        torch.set_num_threads(before)
    assert code == 0, err
    with sqlite3.connect(tmp_path / "r.db") as conn:
        info = json.loads(conn.execute("SELECT info FROM records").fetchone()[0])
    assert info["cpu"]["threads"] == 1 and info["cpu"]["samples"] >= 3 and "busy" in info["cpu"]


def test_ncu_and_rocprof_missing_are_user_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    for tool, exe in (("ncu", "ncu"), ("rocprof", "rocprofv3")):
        code, _, err = _run(["run", "--device", "cpu", "--db", str(tmp_path / "r.db"), "--profiler", tool], capsys)
        assert code == 2 and f"{exe} is not installed" in err


def test_trace_min_time_and_cooldown_on_cpu(tmp_path, capsys):
    db, traces = tmp_path / "r.db", tmp_path / "traces"
    code, _, err = _run([*SMALL, "--db", str(db), "--trace", str(traces), "--min-time-ms", "2", "--ci-target", "0",
                              "--cooldown", "0"], capsys)
    assert code == 0, err
    files = list(traces.glob("*.json"))
    assert len(files) == 1 and "traceEvents" in json.loads(files[0].read_text())
    with sqlite3.connect(db) as conn:
        info_json, n, total = conn.execute("SELECT info, n, timing_mode FROM records").fetchone()
    info = json.loads(info_json)
    assert total == "cpu" and n >= 3 and info["measured_ms"] >= 2.0
    assert info["trace"] == str(files[0]) and info["median_ci95_ms"][0] <= info["median_ci95_ms"][1]
    assert set(info["outliers"]) == {"low", "high", "fences_ms"}


def test_profiler_nsys_reaches_the_plan_as_an_external_timing_mode(monkeypatch):
    """`run --profiler nsys` must time every case from its Nsight Systems kernel trace (timing.external): the
    option once got lost between the options and the plan, and the run silently timed with CUDA events."""
    from attnbench.cli import common, run
    from attnbench.timing import external
    monkeypatch.setattr(external, "find_tool", lambda tool: "/usr/bin/" + tool)
    monkeypatch.setattr(common, "resolve_device", lambda name: "cuda")  # nothing runs: the plan is all we look at
    monkeypatch.setattr("attnbench.plausibility.ceilings", lambda device, peaks: {})
    plan = run.plan_from_options({"profiler": "nsys", "backends": ["naive"], "seq_lens": ["64"]})
    assert plan.profiler == "nsys" and plan.options.timing.mode == "nsys" and plan.options.timing.external
    monkeypatch.setattr(external, "find_tool", lambda tool: None)
    with pytest.raises(common.UserError, match="nsys is not installed"):
        run.plan_from_options({"profiler": "nsys", "backends": ["naive"], "seq_lens": ["64"]})


def test_precise_is_the_tight_setting_and_explicit_flags_still_win():
    from attnbench.cli import timing_opts
    from attnbench.timing.config import CI_TARGET_PCT, PRECISE
    default, _ = timing_opts.resolve({}, "cuda")
    assert default.ci_target_pct == CI_TARGET_PCT == 0.3 and default.max_time_for("cuda") == 150.0
    tight, _ = timing_opts.resolve({"precise": True}, "cuda")
    assert (tight.ci_target_pct, tight.max_time_for("cuda")) == (PRECISE["ci_target_pct"], PRECISE["max_time_ms"])
    mixed, _ = timing_opts.resolve({"precise": True, "ci_target": 0.05, "max_time_ms": 500}, "cuda")
    assert (mixed.ci_target_pct, mixed.max_time_for("cuda")) == (0.05, 500.0)
    cpu, _ = timing_opts.resolve({"precise": True}, "cpu")
    assert cpu.ci_target_pct == 0.1 and cpu.max_time_for("cpu") == 1000.0

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
])
def test_bad_timing_options_one_line_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no profiler installed, whatever this machine has
    db = tmp_path / "r.db"
    code, _, err = _run(["run", "--device", "cpu", "--db", str(db), *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnbench") and needle in lines[0], err
    assert not db.exists()


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


def test_profiler_nsys_reaches_the_nsys_path(tmp_path, capsys, monkeypatch):
    """`run --profiler nsys` re-runs the command under nsys (timing_opts.run_nsys) instead of timing with events:
    the option once got lost between the options and the plan, and the run silently timed with events."""
    from attnbench.cli import common, timing_opts
    monkeypatch.setattr("attnbench.timing.nsys.find_nsys", lambda: "/usr/bin/nsys")
    monkeypatch.setattr(common, "resolve_device", lambda name: "cuda")  # nsys needs a GPU; nothing runs here
    monkeypatch.setattr("attnbench.plausibility.ceilings", lambda device, peaks: {})
    calls = []
    monkeypatch.setattr(timing_opts, "run_nsys", lambda db: calls.append(db))
    db = tmp_path / "r.db"
    code, out, err = _run(["run", "--db", str(db), "--profiler", "nsys", "--seq-lens", "64", "--backends", "naive"],
                          capsys)
    assert code in (0, None) and calls == [db], (out, err)
    assert "cases ok" not in out  # nothing was timed in this process

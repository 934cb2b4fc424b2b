"""A resumed run reads exactly the files it started with, or refuses: editing a serving trace or an ALiBi slopes
file between a run and its --resume would otherwise mix two sweeps in one run."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _attnbench(*args, cwd):
    # the checkout under test, whatever attnbench is installed (a relative PYTHONPATH would not reach it from cwd)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def test_resume_refuses_a_trace_edited_since_the_run_started(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"requests": [[16, 16], [1, 40]]}) + "\n")
    base = ["--device", "cpu", "--q-heads", "2", "--head-size", "16", "--backends", "naive", "--db",
            str(tmp_path / "r.db")]
    first = _attnbench("run", "--batch-trace", str(trace), "--run-id", "R1", "--quiet", *base, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    same = _attnbench("run", "--resume", "R1", "--db", str(tmp_path / "r.db"), "--quiet", cwd=tmp_path)
    assert same.returncode == 0, same.stderr  # the same file: resumed (nothing left to run)
    trace.write_text(json.dumps({"requests": [[32, 32]]}) + "\n")
    edited = _attnbench("run", "--resume", "R1", "--db", str(tmp_path / "r.db"), "--quiet", cwd=tmp_path)
    assert edited.returncode == 2, edited.stderr
    lines = edited.stderr.strip().splitlines()
    assert len(lines) == 1 and "--batch-trace" in lines[0] and "changed since the run started" in lines[0]


def test_resume_refuses_slopes_edited_since_the_run_started(tmp_path):
    slopes = tmp_path / "slopes.txt"
    slopes.write_text("0.5 0.25")
    db = str(tmp_path / "r.db")
    first = _attnbench("run", "--device", "cpu", "--seq-lens", "16", "--q-heads", "2", "--head-size", "16",
                       "--pass", "fwd", "--backends", "naive", "--alibi-slopes", str(slopes), "--run-id", "R2",
                       "--quiet", "--db", db, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    slopes.write_text("0.5 0.125")
    edited = _attnbench("run", "--resume", "R2", "--db", db, "--quiet", cwd=tmp_path)
    assert edited.returncode == 2 and "--alibi-slopes" in edited.stderr and "changed" in edited.stderr


import pytest  # noqa: E402


@pytest.mark.parametrize("args, needle", [
    (["--softcap", "4e38"], "softcap 4e+38 does not fit fp32"),
    (["--softcap", "70000", "--dtype", "fp16"], "softcap 70000 does not fit fp16"),
    (["--softcap", "1e-320"], "softcap 9.99989e-321 underflows fp32"),  # 0 in fp32: the scores / 0 are NaN
    (["--softcap", "1e-5", "--dtype", "fp16"], "softcap 1e-05 underflows fp16"),
    (["--softmax-scale", "1e39"], "softmax scale 1e+39 does not fit fp32"),
    (["--mla", "--kv-heads", "2"], "one KV head, not 2"),
])
def test_numbers_the_dtype_cannot_hold_and_contradictions_are_bad_input(tmp_path, args, needle):
    done = _attnbench("run", "--device", "cpu", "--seq-lens", "64", *args, "--db", str(tmp_path / "x.db"),
                      cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "x.db").exists()  # refused before anything was written


def test_slopes_whose_bias_overflows_are_bad_input(tmp_path):
    slopes = tmp_path / "s.txt"
    slopes.write_text("1e39 1 1 1")
    done = _attnbench("run", "--device", "cpu", "--seq-lens", "64", "--q-heads", "4", "--alibi-slopes", str(slopes),
                      "--db", str(tmp_path / "x.db"), cwd=tmp_path)
    assert done.returncode == 2 and "ALiBi bias" in done.stderr and "does not fit fp32" in done.stderr


def test_a_stop_signal_swallowed_during_start_up_stops_the_run_before_it_starts(tmp_path, monkeypatch):
    """A Ctrl-C while torch imports numpy can be swallowed by the import machinery: the handler recorded it, but
    the run went on for the whole sweep and was stored as done. The run now stops before it starts."""
    import signal

    import attnbench
    from attnbench import interrupt
    plan = attnbench.plan(device="cpu", seq_lens="32", q_heads=2, head_size=8, backends="naive",
                          db=str(tmp_path / "s.db"))
    monkeypatch.setattr(interrupt, "received", [signal.SIGINT])
    with pytest.raises(KeyboardInterrupt):
        attnbench.run(plan)
    assert not (tmp_path / "s.db").exists()  # nothing started, nothing stored as done


def _interrupted(db):
    import sqlite3
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE runs SET status='interrupted'")
    conn.close()


def test_a_trace_not_found_on_resume_is_called_so(tmp_path):
    """From another folder a relative path finds no file, and a deleted file is gone: neither has changed."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    (start / "trace.jsonl").write_text(json.dumps({"requests": [[16, 16], [1, 40]]}) + "\n")
    db = str(tmp_path / "r.db")
    first = _attnbench("run", "--batch-trace", "trace.jsonl", "--run-id", "R3", "--quiet", "--device", "cpu",
                       "--q-heads", "2", "--head-size", "16", "--backends", "naive", "--db", db, cwd=start)
    assert first.returncode == 0, first.stderr
    _interrupted(db)
    for cwd in (elsewhere, start):
        if cwd == start:
            (start / "trace.jsonl").unlink()
        res = _attnbench("run", "--resume", "R3", "--db", db, "--quiet", cwd=cwd)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert "--batch-trace trace.jsonl: no such file" in lines[0] and str(cwd) in lines[0], lines[0]
        assert "changed" not in lines[0]


def test_resuming_a_finished_run_leaves_it_as_it_was(tmp_path):
    import sqlite3
    db = str(tmp_path / "r.db")
    first = _attnbench("run", "--device", "cpu", "--seq-lens", "16", "--q-heads", "1", "--head-size", "8",
                       "--pass", "fwd", "--backends", "naive", "--repeat", "1", "--run-id", "R4", "--quiet",
                       "--db", db, cwd=tmp_path)
    assert first.returncode == 0, first.stderr

    def row():
        conn = sqlite3.connect(db)
        try:
            return conn.execute("SELECT status, finished_at, pid, pid_started, host FROM runs").fetchall()
        finally:
            conn.close()
    before = row()
    res = _attnbench("run", "--resume", "R4", "--db", db, "--output", str(tmp_path / "o.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines() == [f"attnbench: run R4 already finished: {db} holds a record of each "
                                               "of its cases; nothing to resume"]
    assert row() == before and before[0][0] == "done"
    assert len(json.loads((tmp_path / "o.json").read_text())) == 2  # the run's records, exported as asked


def test_a_softcap_the_dtype_holds_as_a_normal_number_is_taken():
    from attnbench.features.softcap import FEATURE
    from attnbench.spec import AttnSpec
    for cap, dtype in ((1e-37, "fp32"), (1e-4, "fp16"), (50.0, "bf16")):
        FEATURE.check(cap, AttnSpec(batch=1, seqlens_q=(64,), heads_q=1, head_dim=8, dtype=dtype))

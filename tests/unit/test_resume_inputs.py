"""A resumed run reads exactly the files it started with, or refuses: editing a serving trace or an ALiBi slopes
file between a run and its --resume would otherwise mix two sweeps in one run."""

import json
import subprocess
import sys


def _attnbench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


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

"""The CLI as a user meets it: the summary at the end of `run`, progress in a log, no false greens, `show`,
`runs`, `--version`, help panels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
SHAPE = ["--device", "cpu", "--q-heads", "2", "--head-size", "16", "--dtype", "fp32", "--warmup", "0", "--repeat", "3"]
SMALL = [*SHAPE, "--min-time-ms", "0"]


def cli(*args, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=SRC, COLUMNS="100", **(env or {}))
    return subprocess.run([sys.executable, "-m", "attnbench", *map(str, args)], capture_output=True, text=True,
                          env=full, timeout=300, cwd=cwd)


def test_run_ends_in_a_summary_and_a_piped_log_shows_progress(tmp_path):
    db = tmp_path / "r.db"
    res = cli("run", *SMALL, "--seq-lens", "64", "128", "--backends", "naive,sdpa-math", "--db", db)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0].startswith("b1 h2 d16 fp32") and "GF/s" in out[0] and "cases ran" in out[0]  # CPU rates
    assert any(line.split()[:2] == ["no", "mask"] for line in out) and max(len(line) for line in out[:-2]) <= 100
    assert "│" not in res.stdout  # no per-record table unless asked
    assert "16/16 cases ok" in res.stdout and "attnbench show --table" in res.stdout and "stored in" in res.stdout
    assert res.stderr.startswith("attnbench: [0/16]")  # not a terminal: progress as log lines
    table = cli("run", *SMALL, "--seq-lens", "64", "--backends", "naive", "--db", db, "--table")
    assert "│ naive" in table.stdout and "cases ran" in table.stdout


def test_a_named_backend_that_cannot_run_is_an_error_before_anything_runs(tmp_path):
    db = tmp_path / "r.db"
    res = cli("run", "--device", "cpu", "--backends", "naive,sdpa-cudnn", "--db", db)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "backend sdpa-cudnn runs on cuda" in res.stderr and not db.exists()
    res = cli("verify", "--device", "cpu", "--backends", "naive,sdpa-cudnn", "--db", db)
    assert res.returncode == 2 and "sdpa-cudnn" in res.stderr and not db.exists()
    res = cli("run", *SMALL, "--seq-lens", "64", "--pass", "fwd", "--no-causal", "--backends", "naive,sdpa-cudnn",
              "--skip-missing", "--db", db)
    assert res.returncode == 0, res.stderr
    assert "1 unsupported: runs on cuda, not cpu (sdpa-cudnn)" in res.stdout  # recorded, with the reason
    db.unlink()
    res = cli("run", "--device", "cpu", "--backends", "naive", "--baseline", "sdpa-math", "--db", db)
    assert res.returncode == 2 and "--baseline sdpa-math is not among the backends" in res.stderr
    res = cli("run", "--device", "cpu", "--backends", "naive", "--metric", "flops", "--db", db)
    assert res.returncode == 2 and "bad --metric 'flops'" in res.stderr and not db.exists()


def test_verify_that_checks_nothing_fails(tmp_path):
    # sdpa-math has no grouped (varlen) path: every case is unsupported, nothing is checked
    res = cli("verify", *SHAPE, "--seq-lens", "16,16", "--backends", "sdpa-math", "--db", tmp_path / "v.db")
    assert res.returncode == 1 and "nothing was checked" in res.stderr


def test_show_runs_version_and_help_panels(tmp_path):
    db = tmp_path / "r.db"
    assert cli("run", *SMALL, "--seq-lens", "64", "--backends", "naive,sdpa-math", "--db", db).returncode == 0
    runs = cli("runs", "--db", db)
    assert runs.returncode == 0 and "8/8" in runs.stdout and "attnbench run" in runs.stdout
    show = cli("show", "--db", db, "--baseline", "naive")
    assert show.returncode == 0 and "x vs naive" in show.stdout and "1.00" in show.stdout
    assert "│ sdpa-math" in cli("show", "--db", db, "--table").stdout
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("attnbench 0.")
    help_text = cli("run", "--help").stdout
    for panel in ("Backends", "Shape", "Timing", "Output", "Run control", "Inputs and accuracy"):
        assert f"─ {panel} ─" in help_text
    assert "--batch-size " in help_text and "…" not in help_text  # full flag names, aliases not listed
    assert "default: 30 on GPU, 10 on CPU" in " ".join(help_text.split())


def test_write_up_flag_spellings_still_work(tmp_path):
    res = cli("run", "--device", "cpu", "--batch_size", "1", "--seq_len", "32", "--num_heads", "2", "--emb_dim", "32",
              "--backend", "naive", "--repeats", "3", "--warmup", "0", "--pass", "fwd", "--no-causal", "--quiet",
              "--db", tmp_path / "r.db")
    assert res.returncode == 0, res.stderr

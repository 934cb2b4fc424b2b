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


def _record_rows(text: str, backend: str) -> list[str]:
    """The lines of a per-record table (``--table``) that are ``backend``'s."""
    return [line for line in text.splitlines() if line.split()[:1] == [backend] and " b1 " in line]


def test_run_ends_in_a_summary_and_a_piped_log_shows_progress(tmp_path):
    db = tmp_path / "r.db"
    res = cli("run", *SMALL, "--seq-lens", "64", "128", "--backends", "naive,sdpa-math", "--db", db)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0].startswith("b1 h2 d16 fp32") and "GF/s" in out[0] and "cases ran" in out[0]  # CPU rates
    assert any(line.split()[:2] == ["no", "mask"] for line in out) and max(len(line) for line in out[:-2]) <= 100
    assert not _record_rows(res.stdout, "naive")  # no per-record table unless asked
    assert "16/16 cases ok" in res.stdout and "attnbench show --table" in res.stdout and "stored in" in res.stdout
    assert res.stderr.startswith("attnbench: [0/16]")  # not a terminal: progress as log lines
    table = cli("run", *SMALL, "--seq-lens", "64", "--backends", "naive", "--db", db, "--table")
    assert _record_rows(table.stdout, "naive") and "cases ran" in table.stdout


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
    # sdpa-flash has no grouped (varlen) path: every case is unsupported, nothing is checked
    res = cli("verify", *SHAPE, "--seq-lens", "16,16", "--backends", "sdpa-flash", "--db", tmp_path / "v.db")
    assert res.returncode == 1 and "nothing was checked" in res.stderr


def test_show_runs_version_and_help_panels(tmp_path):
    db = tmp_path / "r.db"
    assert cli("run", *SMALL, "--seq-lens", "64", "--backends", "naive,sdpa-math", "--db", db).returncode == 0
    runs = cli("runs", "--db", db)
    assert runs.returncode == 0 and "8/8" in runs.stdout and "  run --device cpu" in runs.stdout
    show = cli("show", "--db", db, "--baseline", "naive")
    assert show.returncode == 0 and "x vs naive" in show.stdout and "1.00" in show.stdout
    assert any(line.split()[:1] == ["sdpa-math"] for line in cli("show", "--db", db, "--table").stdout.splitlines())
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


def test_small_things_a_newcomer_read_wrongly(tmp_path):
    db = tmp_path / "r.db"
    for run_id in ("first", "second"):
        res = cli("run", *SMALL, "--seq-lens", "64", "--backends", "naive", "--pass", "fwd", "--no-causal", "--db", db,
                  "--run-id", run_id, "--quiet")
        assert res.returncode == 0, res.stderr
    # --baseline with --metric ms showed times and ignored the baseline without a word
    for command in ("show", "run"):
        extra = [] if command == "show" else [*SMALL, "--seq-lens", "64", "--backends", "naive"]
        res = cli(command, *extra, "--db", db, "--baseline", "naive", "--metric", "ms")
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--baseline naive gives speedups" in res.stderr
    # a run id that is not there: the most recent runs, the newest first
    res = cli("show", "--db", db, "--run", "third")
    assert res.returncode == 2 and "most recent: second (done), first (done)" in res.stderr
    # the report goes beside the store (as plots do), not into the folder the command ran in
    res = cli("report", "--db", db, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "report-second.html").is_file() and not (tmp_path / "report.html").exists()
    res = cli("report", "--db", db, "--run", "first", "--run", "second")
    assert (tmp_path / "report-first+1.html").is_file(), res.stderr


def test_a_comma_list_that_most_backends_skip_says_what_ran(tmp_path):
    # --skip-missing: named backends that take none of the cases are refused otherwise (exit 2), and the
    # refusal names the same fix (test_nothing_runs.py)
    res = cli("run", *SMALL, "--seq-lens", "64,96", "--backends", "naive,sdpa-flash,flex-sparse", "--pass", "fwd",
              "--no-causal", "--skip-missing", "--db", tmp_path / "r.db")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert ("--seq-lens 64,96 ran as one grouped (varlen) case, a batch of 2 sequences, which 2 of 3 backends skip; "
            "one case per length: --seq-lens 64 96") in text
    res = cli("run", *SMALL, "--seq-lens", "64,96", "--backends", "naive", "--pass", "fwd", "--no-causal",
              "--db", tmp_path / "s.db")
    assert res.returncode == 0 and "grouped (varlen)" not in res.stdout  # asked for and run: nothing to say
    res = cli("run", *SMALL, "--seq-lens", "64,64", "--backends", "naive,sdpa-flash,flex-sparse", "--pass", "fwd",
              "--no-causal", "--skip-missing", "--db", tmp_path / "t.db")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())  # equal lengths: the summary's row is named 2q64
    assert "--seq-lens 64,64 (row 2q64) ran as one grouped (varlen) case, a batch of 2 sequences" in text
    assert "\n2q64 " in res.stdout

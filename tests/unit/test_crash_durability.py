"""SIGKILL `attnbench run` at random moments: the store stays sound and --resume completes the rest.

Most runs are started from a forkserver that has imported attnbench once (a plain interpreter needs
~3 s here just to import torch, which would leave the kills nothing to hit); the child executes the
same ``attnbench.cli.main`` as the console script. The first start and the final resume are real
``python -m attnbench`` subprocesses.
"""

import json
import multiprocessing
import os
import random
import sqlite3
import sys
import time

from reliability_helpers import PLUGINS, TINY, attnbench, env, popen, query

from attnbench.results.record import case_id
from attnbench.spec import AttnSpec

KILLS = 20
SLEEP = "0.05"  # seconds per call of test-sleep: a 600-case sweep takes ~17 s, more than the kills allow it
LENGTHS = range(16, 316)  # 300 lengths x 2 backends = 600 cases
BACKENDS = ("naive", "test-sleep")
# --min-time-ms 5: a case is one or two calls, so the final resume (0.001 s calls) is quick even on a busy machine
ARGS = [*TINY, "--min-time-ms", "5", "--batch-size", "1", "--seq-lens", f"{LENGTHS[0]}..{LENGTHS[-1]}:+1", "--backends", ",".join(BACKENDS)]


def _child(argv, environ):
    """Forkserver child: become `attnbench run ARGV` (output discarded)."""
    os.environ.update(environ)
    sys.path.insert(0, PLUGINS)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    from attnbench import cli
    cli.main(argv)


def snapshot(db):
    """Open the store as a reader would; check integrity; every row's JSON parses. id -> row."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = {}
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name='records'").fetchone():
            return rows  # killed (or looked at) between creating the file and committing its schema
        for row in conn.execute("SELECT id, case_id, status, spec, info, samples_ms, accuracy FROM records"):
            for text in row[3:]:
                json.loads(text)
            rows[row[0]] = row
        return rows
    finally:
        conn.close()


def test_random_sigkills_lose_nothing_finished_and_resume_completes(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    rng = random.Random(1234)
    monkeypatch.setenv("PYTHONPATH", env()["PYTHONPATH"])  # the forkserver imports this checkout
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["attnbench.cli", "attnbench.runner"])
    child_env = {k: v for k, v in env(ATTNBENCH_TEST_SLEEP_S=SLEEP).items() if k.startswith(("ATTNBENCH", "PY"))}

    # first start: a real subprocess, killed once it has written a few records
    proc = popen("run", *ARGS, "--db", str(db), ATTNBENCH_TEST_SLEEP_S=SLEEP)
    while proc.poll() is None and not (db.exists() and len(snapshot(db)) >= 3):
        time.sleep(0.02)
    proc.kill()
    proc.communicate()
    seen = snapshot(db)
    [(run_id,)] = query(db, "SELECT run_id FROM runs")
    killed_mid_run = 0
    for _ in range(KILLS - 1):
        child = ctx.Process(target=_child, args=(["run", "--resume", run_id, "--db", str(db), "--quiet"], child_env))
        child.start()
        time.sleep(rng.uniform(0.05, 1.2))
        child.kill()
        child.join()
        killed_mid_run += child.exitcode == -9
        now = snapshot(db)
        assert len(now) >= len(seen)
        assert all(now[i] == row for i, row in seen.items()), "a finished record changed after a kill"
        seen = now
    assert killed_mid_run >= KILLS // 2, killed_mid_run
    assert 0 < len(seen) < len(LENGTHS) * len(BACKENDS)  # the kills landed while there was work left

    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet", ATTNBENCH_TEST_SLEEP_S="0.001")
    assert res.returncode == 0, res.stderr
    final = snapshot(db)
    assert all(final[i] == row for i, row in seen.items())
    ids = [row[1] for row in final.values()]
    expected = {case_id(AttnSpec(batch=1, seqlens_q=(n,), heads_q=1, head_dim=8, dtype="fp32", pass_="fwd"), b, "cpu")
                for n in LENGTHS for b in BACKENDS}
    assert len(ids) == len(set(ids)) and set(ids) == expected
    assert query(db, "SELECT status FROM runs") == [("done",)]

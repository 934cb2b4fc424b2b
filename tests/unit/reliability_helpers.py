"""Running `attnbench` the way a user does (a subprocess), with the misbehaving test backends loaded."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")
PLUGINS = str(ROOT / "tests" / "plugins")
TINY = ["--device", "cpu", "--q-heads", "1", "--head-size", "8", "--dtype", "fp32", "--pass", "fwd",
        "--no-causal", "--warmup", "0", "--repeat", "1", "--quiet"]


def env(**extra) -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([SRC, PLUGINS]),
                ATTNBENCH_PLUGINS="attnbench_test_backends", **extra)


def popen(*args, **extra_env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnbench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(**extra_env))


def attnbench(*args, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True,
                          env=env(**extra_env), timeout=timeout)


def query(db, sql, *args):
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()

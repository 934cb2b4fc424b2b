"""Results tooling on real GPUs: peak memory in plots and reports, torchrun sharding over devices."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

SRC = str(Path(__file__).resolve().parents[2] / "src")
SWEEP = ["--backends", "naive,sdpa-flash", "--q-heads", "8", "--head-size", "64", "--dtype", "bf16",
         "--seq-lens", "512", "1024", "2048", "--pass", "fwd", "fwd_bwd", "--causal", "both", "--warmup", "2",
         "--repeat", "10", "--quiet"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _attnbench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench", *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=600)


def test_memory_plot_and_report_from_a_gpu_run(tmp_path):
    db = tmp_path / "g.db"
    res = _attnbench("run", *SWEEP, "--run-id", "gpu-1", "--db", db)
    assert res.returncode == 0, res.stderr
    with sqlite3.connect(db) as conn:
        mem = conn.execute("SELECT peak_mem_bytes FROM records WHERE status='ok'").fetchall()
    assert mem and all(m[0] is not None and m[0] > 0 for m in mem)
    res = _attnbench("plot", "--db", db, "--x", "seq_len", "--y", "mem,tflops", "-o", tmp_path / "f")
    assert res.returncode == 0, res.stderr
    for name in ("f-mem.png", "f-mem.svg", "f-tflops.png", "f-tflops.svg"):
        assert (tmp_path / name).stat().st_size > 5000
    res = _attnbench("report", "--db", db, "-o", tmp_path / "r.html")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "r.html").read_text()
    assert "peak memory (MiB) vs sequence length" in text
    assert text.count("data:image/svg+xml,") >= 3  # figures inline as URL-encoded SVG (report/html.py)
    res = _attnbench("compare", "gpu-1", "gpu-1", "--db", db, "--fail-on-regression", "5%")
    assert res.returncode == 0 and "same" in res.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_torchrun_puts_each_rank_on_its_own_gpu(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "sweep.db"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "attnbench", "run", *SWEEP, "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    parts = [tmp_path / f"sweep.rank{i}.db" for i in range(2)]
    devices, runs, count = set(), set(), 0
    for i, part in enumerate(parts):
        with sqlite3.connect(part) as conn:
            rows = conn.execute("SELECT device, run_id FROM records").fetchall()
        assert rows and {r[0] for r in rows} == {f"cuda:{i}"}
        devices |= {r[0] for r in rows}
        runs |= {r[1] for r in rows}
        count += len(rows)
    assert devices == {"cuda:0", "cuda:1"} and len(runs) == 1
    res = _attnbench("merge", tmp_path / "all.db", *parts)
    assert res.returncode == 0, res.stderr
    with sqlite3.connect(tmp_path / "all.db") as conn:
        assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == count == 3 * 2 * 2 * 2

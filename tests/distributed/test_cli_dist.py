"""`attnbench dist` end to end on gloo: torchrun output in the FA2 write-up's format, records, failures, rejections."""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cp_workers import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMALL = ["--device", "cpu", "--seq-lens", "64", "--q-heads", "4", "--kv-heads", "2", "--head-size", "16",
         "--dtype", "fp32", "--warmup", "0", "--repeat", "2"]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(extra)
    return env


def test_torchrun_two_ranks(tmp_path):
    db = tmp_path / "r.db"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "attnbench", "dist", "--method", "zigzag,torch-cp,ulysses-ce", "--kernel", "sdpa-math", *SMALL,
           "--causal", "--pass", "fwd_bwd", "--details", "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    for rank in (0, 1):
        assert f"rank {rank} out (distributed) - out_ref (non-distributed) diff: " in out
        assert f"Rank[{rank}] max " in out
    assert "dq diff:" in out and "dk diff:" in out and "dv diff:" in out
    assert "verdict: pass" in out
    # the FA2 write-up's columns, named to fit 100 columns; a CPU's rates in GFLOP/s, as every view of a CPU run has them
    assert "| batch | seq_len | heads | head_size | fwd_only | iters/s | ms/iter | MB/device | GFLOP/s |" in out
    row = next(line for line in out.splitlines() if line.startswith("| 1 | 64 | 4 | 16 | False |"))
    assert max(len(line) for line in out.splitlines() if line.startswith("|")) <= 100
    assert out.count("unsupported: torch native context parallel (torch-cp) runs on CUDA only") == 1  # rank 0 prints
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT backend, status, reason, info, accuracy, tflops, median_ms FROM records").fetchall()
    by_backend = {r[0]: r for r in rows}
    assert set(by_backend) == {"cp-zigzag:sdpa-math", "cp-torch-cp:sdpa-math", "cp-ulysses-ce:sdpa-math"}
    zig = by_backend["cp-zigzag:sdpa-math"]
    assert zig[1] == "ok" and zig[5] > 0 and zig[6] > 0
    info, accuracy = json.loads(zig[3]), json.loads(zig[4])
    busy = info["cpu"]["busy"]  # a busy CPU on any rank: its numbers marked, as run marks them
    assert row.endswith(" ? |") == busy and ("? other processes used the CPU" in out) == busy
    assert info["method"] == "zigzag" and info["world_size"] == 2 and info["layout"] == "zigzag"
    assert len(info["per_rank_diffs"]) == 2 and set(info["per_rank_diffs"][1]) == {"out", "dq", "dk", "dv"}
    per_rank = info["samples_per_rank"]  # each rank's own samples; the record's are their element-wise max
    assert len(per_rank) == 2 and all(len(s) == 2 for s in per_rank)
    assert zig[6] == pytest.approx(statistics.median(max(a, b) for a, b in zip(*per_rank)), rel=1e-3)
    assert accuracy["verdict"] == "pass" and len(accuracy["per_rank"]) == 2
    assert by_backend["cp-torch-cp:sdpa-math"][1] == "unsupported" and "CUDA" in by_backend["cp-torch-cp:sdpa-math"][2]
    ce = by_backend["cp-ulysses-ce:sdpa-math"]  # copies between GPUs: a CPU job says so, and goes on
    assert ce[1] == "unsupported" and "needs CUDA and one GPU per rank" in ce[2]


def test_failing_rank_ends_the_job_without_hanging(tmp_path):
    port = free_port()
    procs = []
    start = time.monotonic()
    for rank in (0, 1):
        env = _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), ATTNBENCH_DIST_FAIL_RANK="1")
        cmd = [sys.executable, "-m", "attnbench", "dist", "--method", "ring", *SMALL, "--timeout", "10",
               "--db", str(tmp_path / "f.db")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=120) for p in procs]
    assert time.monotonic() - start < 120
    assert [p.returncode for p in procs] == [1, 1]
    assert "attnbench: error: rank 1: RuntimeError: injected failure" in outs[1][1]
    assert outs[0][1].startswith("attnbench: error: rank 0: ")  # the peer sees the failure and stops too
    with sqlite3.connect(tmp_path / "f.db") as conn:
        assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == 0
        assert conn.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]


def test_rejects_length_not_divisible_before_starting(tmp_path):
    db = tmp_path / "r.db"
    cmd = [sys.executable, "-m", "attnbench", "dist", "--method", "zigzag", *SMALL, "--seq-lens", "66", "--causal",
           "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1",
                                                                       MASTER_PORT=str(free_port())), timeout=120)
    assert res.returncode == 2
    assert "sequence length 66 is not a multiple of 4" in res.stderr and "64 or 68" in res.stderr
    assert res.stderr.count("\n") == 1  # one line, no traceback
    assert not db.exists()


def test_timeline_records_every_step_phase_by_phase(tmp_path):
    # zigzag causal fwd_bwd on 2 ranks: two steps per pass, each with its kernel and merge, the backward's
    # dK/dV waits, and phases that add up to about the call's time (not double counted, nothing left out).
    db = tmp_path / "t.db"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "attnbench", "dist", "--method", "zigzag,ulysses", "--kernel", "sdpa-flash", "--device", "cpu",
           "--seq-lens", "1032", "--q-heads", "4", "--kv-heads", "2", "--head-size", "32", "--dtype", "fp32",
           "--warmup", "1", "--repeat", "5", "--causal", "--pass", "fwd_bwd", "--no-check", "--timeline", "3",
           "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("timeline, ms per call (median of 3 recorded calls") == 2
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT backend, info || '|' || median_ms FROM records").fetchall())
    info = json.loads(rows["cp-zigzag:sdpa-flash"].split("|")[0])
    per_rank, call_ms = info["timeline"], info["timeline_call_ms"]
    assert len(per_rank) == len(call_ms) == 2
    for phases, whole in zip(per_rank, call_ms):
        seen = {(p, s, ph) for p, s, ph, _ in phases}
        for pass_ in ("fwd", "bwd"):
            for step in (0, 1):
                assert {(pass_, step, "kernel"), (pass_, step, "merge")} <= seen
        assert ("bwd", 1, "wait") in seen and all(ms >= 0 for *_, ms in phases)
        # the phases of the recorded calls against those calls' own time (not the timed calls': a busy machine
        # moves the two apart): per phase medians add up to about the median call, nothing counted twice
        assert 0.5 < sum(ms for *_, ms in phases) / whole < 1.5
    uly = json.loads(rows["cp-ulysses:sdpa-flash"].split("|")[0])["timeline"][0]
    assert {(p, ph) for p, _, ph, _ in uly} >= {("fwd", "a2a"), ("fwd", "kernel"), ("bwd", "a2a"), ("bwd", "kernel")}


def test_links_on_two_gloo_ranks(tmp_path):
    """`attnbench links` measures ring send/recv and all-to-all at every size and fits latency and bandwidth."""
    out_json = tmp_path / "links.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "attnbench", "links", "--max-mib", "1", "--repeat", "3", "--output", str(out_json)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    assert doc["world_size"] == 2 and doc["backend"] == "gloo"
    sizes = sorted({r["bytes"] for r in doc["rows"]})
    assert sizes == [4096, 16384, 65536, 262144, 1048576]
    for kind in ("p2p", "a2a"):
        rows = [r for r in doc["rows"] if r["kind"] == kind]
        assert len(rows) == len(sizes) and all(r["median_ms"] > 0 and r["gbs"] > 0 for r in rows)
        fit = doc["fit"][kind]
        assert fit["latency_us"] > 0 and fit["to_bytes"] == 1048576
        # gloo through host memory on a shared CPU is noisy: about one run in five, a 4 KiB transfer's median is
        # slower than the 1 MiB one's, and the fit then says so instead of dividing by ~0 (10^18 GB/s before)
        assert (fit["gbs"] or 0) > 0 or "took no longer than the smallest" in fit["unfitted"], fit
    a2a = next(r for r in doc["rows"] if r["kind"] == "a2a" and r["bytes"] == 4096)
    assert a2a["counted_bytes"] == 2048  # half of the tensor crosses to the other rank
    assert "p2p: latency" in res.stdout and "bandwidth" in res.stdout


def test_links_refuses_a_world_of_one():
    res = subprocess.run([sys.executable, "-m", "attnbench", "links"], capture_output=True, text=True, env=_env(),
                         timeout=120)
    assert res.returncode == 2 and "torchrun" in res.stderr and "Traceback" not in res.stderr


def test_nproc_starts_the_ranks_and_records_by_the_backends_names(tmp_path):
    db = tmp_path / "n.db"
    cmd = [sys.executable, "-m", "attnbench", "dist", "--nproc", "2", "--method", "ring", "--kernel", "math", *SMALL,
           "--pass", "fwd", "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "verdict: pass" in res.stdout and res.stderr == ""
    with sqlite3.connect(db) as conn:  # the old name is read, the backend's name recorded
        assert set(conn.execute("SELECT backend, status FROM records").fetchall()) == {("cp-ring:sdpa-math", "ok")}


@pytest.mark.parametrize("kernel, needle", [("flashy", "unknown --kernel 'flashy'; the local kernels: sdpa-flash"),
                                            ("naive", "kernel naive cannot be used for context parallelism")])
def test_a_wrong_kernel_is_one_line_before_any_rank_starts(tmp_path, kernel, needle):
    cmd = [sys.executable, "-m", "attnbench", "dist", "--nproc", "2", "--method", "ring", "--kernel", kernel, *SMALL,
           "--db", str(tmp_path / "w.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [res.stderr.strip()] and needle in res.stderr, res.stderr
    assert not (tmp_path / "w.db").exists()


def test_under_torchrun_a_wrong_kernel_is_one_line_from_rank_0_and_no_traceback_of_ours(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "attnbench", "dist", "--method", "ring", "--kernel", "flashy", *SMALL, "--db", str(tmp_path / "w.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode != 0
    ours = [line for line in res.stderr.splitlines() if line.startswith("attnbench:")]
    assert ours[0] == ("attnbench: error: unknown --kernel 'flashy'; the local kernels: sdpa-flash, sdpa-efficient, "
                       "sdpa-cudnn, sdpa-math, fa2, fa3, fa4")
    assert len(ours) <= 2  # one line per rank at most (rank 1 is silent unless stopped while torch imports)
    assert "attnbench/entry.py" not in res.stderr and "attnbench/cli" not in res.stderr
    # torchrun's own report names rank 0, which said why, as the root cause
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert "rank      : 0" in root and "exitcode  : 2" in root


def test_packed_documents_run_checked_and_their_table_says_how_many(tmp_path):
    db = tmp_path / "d.db"
    cmd = [sys.executable, "-m", "attnbench", "dist", "--nproc", "2", "--method", "zigzag,ulysses", "--kernel", "math",
           "--device", "cpu", "--batch-size", "1", "--q-heads", "4", "--head-size", "16", "--dtype", "fp32", "--seq-lens", "256",
           "--documents", "32", "--causal", "--pass", "fwd_bwd", "--repeat", "1", "--warmup", "0", "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("verdict: pass") == 2
    from attnbench.distributed.documents import long_tailed
    count = len(long_tailed(256, 32, 0))
    assert res.stdout.count(f"| 1 | 256 ({count} docs) | 4 | 16 | False |") == 2
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT spec, info, flops FROM records").fetchall()
    spec, info, flops = json.loads(rows[0][0]), json.loads(rows[0][1]), rows[0][2]
    assert sum(spec["seqlens_q"]) == 256 and len(spec["seqlens_q"]) == count
    assert info["documents"]["count"] == count
    assert flops < 4 * 256 * 256 * 4 * 16 / 2  # within documents: fewer pairs than one causal sequence


@pytest.mark.parametrize("args, needle", [
    (["--method", "usp", "--documents", "32"], "packed documents (a group of --seq-lens, or --documents) run on ring, "
                                                "zigzag, ulysses, ulysses-ce, torch-cp-flex, not usp"),
    (["--method", "ring", "--documents", "32", "--batch-size", "2"], "give --batch-size 1"),
    (["--method", "ring", "--documents", "1k"], "--documents 1k: a mean document length must be in 1..256"),
    (["--method", "ring", "--documents", "8,16"], "--documents takes one mean length"),
    (["--method", "ring", "--documents", "0"], "bad --documents '0': must be a positive integer"),
    (["--method", "ring", "--documents", "abc"], "bad --documents 'abc'"),
    (["--method", "ring", "--documents", "1", "--seq-lens", "8192"], "documents in 8192 tokens: at most 4096"),
])
def test_packed_documents_refuse_what_they_cannot_run_in_one_line(tmp_path, args, needle):
    cmd = [sys.executable, "-m", "attnbench", "dist", "--nproc", "2", "--kernel", "math", "--device", "cpu", "--q-heads", "4",
           "--head-size", "16", "--dtype", "fp32", *args, "--db", str(tmp_path / "w.db")]
    if "--seq-lens" not in args:
        cmd += ["--seq-lens", "256"]
    if "--batch-size" not in args:
        cmd += ["--batch-size", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert res.stderr.splitlines() == [res.stderr.strip()] and needle in res.stderr, res.stderr


def test_a_long_case_has_a_heartbeat_a_quick_one_none(capsys, monkeypatch):
    # a compile or a check that runs for minutes must not look like a hang (torch-cp-flex's first GPU attempt printed
    # nothing for 375 s); a case quicker than the beat prints nothing (the quick runs above keep stderr empty)
    import time

    from attnbench.cli import dist as dist_cli
    monkeypatch.setattr(dist_cli.Heartbeat, "EVERY_S", 0.05)
    with dist_cli.Heartbeat("[0/2]", "ring b1 s64 h2 d8 fp32 fwd") as beat:
        beat.say("checking every rank against one device")
        time.sleep(0.3)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) >= 3 and all(line.startswith("attnbench: [0/2] still running ring b1 s64 h2 d8 fp32 fwd: "
                                                   "checking every rank against one device (") for line in lines), err
    monkeypatch.setattr(dist_cli.Heartbeat, "EVERY_S", 5.0)
    with dist_cli.Heartbeat("[1/2]", "ulysses"):
        pass
    assert capsys.readouterr().err == ""

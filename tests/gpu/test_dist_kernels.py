"""CUDA local kernels behind the context-parallel interface (one GPU), and the multi-GPU job (>= 2 GPUs).

Run on the GPU machine: PYTHONPATH=src python3 -m pytest -q -m gpu tests/gpu/test_dist_kernels.py
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbench.distributed.kernels import KernelUnavailable, get_kernel
from attnbench.distributed.reference import exact_attention
from attnbench.distributed.ring import merge

pytestmark = pytest.mark.gpu
KERNELS = ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "fa2", "fa3", "fa4"]


def _free_port() -> int:
    """A port for torchrun's rendezvous: its default 29500 is taken when tests run in parallel (pytest -n)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pythonpath() -> str:
    """This checkout's src first, then what the caller had (kernel packages installed with --target)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    return os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])


def _kernel(name):
    try:
        return get_kernel(name)
    except KernelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("hkv", [8, 2])
def test_block_merge_and_global_backward(name, hkv):
    # Two key blocks merged in fp32 equal full attention; each block's backward given the merged
    # out/lse sums to the full gradients. This is exactly how ring attention uses the kernel.
    kernel = _kernel(name)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q, do = (torch.randn(2, 1024, 8, 128, device=dev, dtype=dt) for _ in range(2))
    k, v = (torch.randn(2, 2048, hkv, 128, device=dev, dtype=dt) for _ in range(2))
    exact = exact_attention(q, k, v, do, causal=False, scale=128 ** -0.5)
    halves = [slice(0, 1024), slice(1024, 2048)]
    out = lse = None
    for b in halves:
        bo, bl = kernel.fwd(q, k[:, b], v[:, b], False, 128 ** -0.5)
        assert bl.shape == (2, 8, 1024) and bl.dtype == torch.float32, "LSE must be (B, H, S) fp32"
        assert torch.isfinite(bl).all() and bl.abs().sum() > 0, "an all-zero LSE would silently break merging"
        out, lse = (bo.float(), bl.transpose(1, 2).unsqueeze(-1)) if out is None else merge(out, lse, bo, bl)
    assert (out - exact["out"]).abs().max() < 2e-2
    out_b, lse_b = out.to(dt), lse.squeeze(-1).transpose(1, 2).contiguous()
    dk, dv = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
    dq = torch.zeros_like(q, dtype=torch.float32)
    for b in halves:
        bdq, bdk, bdv = kernel.bwd(do, q, k[:, b].contiguous(), v[:, b].contiguous(), out_b, lse_b, False,
                                   128 ** -0.5)
        dq += bdq.float()
        dk[:, b] += bdk.float()
        dv[:, b] += bdv.float()
    for name_, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        ref = exact[name_]
        assert (got - ref).abs().max() <= 2e-2 * max(1.0, float(ref.abs().max())), name_


@pytest.mark.parametrize("name", KERNELS)
def test_causal_diagonal_block(name):
    kernel = _kernel(name)
    if why := kernel.reason("cuda", "fp16"):  # e.g. an FA3 build without fp16
        pytest.skip(why)
    torch.manual_seed(1)
    q, k, v, do = (torch.randn(1, 777, 4, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    out, lse = kernel.fwd(q, k, v, True, 0.125)
    exact = exact_attention(q, k, v, do, causal=True, scale=0.125)
    assert (out.float() - exact["out"]).abs().max() < 1e-2
    dq, dk, dv = kernel.bwd(do, q, k, v, out, lse, True, 0.125)
    assert (dv.float() - exact["dv"]).abs().max() < 5e-2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_torchrun_every_method_passes_on_gpus(tmp_path):
    n = min(4, torch.cuda.device_count())
    env = dict(os.environ, PYTHONPATH=_pythonpath(), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_free_port()), "--nproc_per_node", str(n), "-m", "attnbench", "dist",
           "--method", "ring,zigzag,ulysses,usp,torch-cp", "--kernel", "sdpa-flash", "--seq-lens", "8192",
           "--q-heads", "8", "--kv-heads", "8", "--head-size", "128", "--dtype", "bf16", "--causal", "both",
           "--pass", "fwd_bwd", "--warmup", "2", "--repeat", "5", "--db", str(tmp_path / "g.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("verdict: pass") == 10, res.stdout[-5000:]
    assert "verdict: fail" not in res.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ranks_time_the_same_calls_on_gpus(tmp_path):
    # The first case of a job with one warm-up call holds each device for a long, per-rank spin before every
    # timed call; unless the devices start each call together, one rank waits for the other inside its
    # timed calls (seen: 2x its peer's time). Every rank's own median must match the others'.
    env = dict(os.environ, PYTHONPATH=_pythonpath(), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_free_port()), "--nproc_per_node", "2", "-m", "attnbench", "dist",
           "--method", "zigzag", "--kernel", "sdpa-cudnn", "--seq-lens", "64k", "--q-heads", "16", "--head-size", "128",
           "--dtype", "bf16", "--pass", "fwd", "--warmup", "1", "--repeat", "5", "--no-check",
           "--db", str(tmp_path / "t.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    from attnbench.results.store import ResultStore
    (rec,) = ResultStore(tmp_path / "t.db").records()
    medians = [statistics.median(s) for s in rec.info["samples_per_rank"]]
    assert max(medians) < 1.05 * min(medians), medians


@pytest.mark.parametrize("kernel", ["fa3", "fa2", "sdpa-cudnn"])
def test_ranks_sharing_one_gpu_check_every_method(tmp_path, kernel):
    # Four ranks on one GPU (gloo through host memory): every method, the USP 2 x 2 mesh included, runs its
    # real multi-rank path with the real kernel and passes the per-rank check; nothing is timed.
    _kernel(kernel)
    env = dict(os.environ, PYTHONPATH=_pythonpath(), CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")[:1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_free_port()), "--nproc_per_node", "4", "-m", "attnbench", "dist",
           "--method", "ring,zigzag,ulysses,usp", "--ulysses-degree", "2", "--kernel", kernel,
           "--seq-lens", "4104", "--q-heads", "8", "--kv-heads", "4", "--head-size", "128", "--dtype", "bf16",
           "--causal", "both", "--pass", "fwd_bwd", "--db", str(tmp_path / "s.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("verdict: pass") == 8, res.stdout[-5000:]
    assert "4 ranks share each GPU" in res.stdout and "not timed" in res.stdout
    from attnbench.results.store import ResultStore
    rows = ResultStore(tmp_path / "s.db").records()
    assert len(rows) == 8 and all(r.median_ms is None and r.accuracy["verdict"] == "pass" for r in rows)
    assert {r.info["world_size"] for r in rows} == {4} and {r.info["backend"] for r in rows} == {"gloo"}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("chunks", ["1", "2"])
def test_copy_engine_ulysses_passes_on_gpus(tmp_path, chunks):
    # The forward's all-to-alls as peer copies into symmetric memory, in one exchange or pipelined over head
    # chunks, with GQA and a batch of 2 (the packed pieces are then not plain slices of the inputs): every rank's
    # output must match one GPU's, and the timed calls must reuse the same buffers without corrupting them.
    n = min(4, torch.cuda.device_count())
    env = dict(os.environ, PYTHONPATH=_pythonpath(), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_free_port()), "--nproc_per_node", str(n),
           "-m", "attnbench", "dist", "--method", "ulysses-ce,ulysses", "--ulysses-chunks", chunks,
           "--kernel", "sdpa-flash", "--batch-size", "2", "--seq-lens", "4096", "--q-heads", "16", "--kv-heads", "8",
           "--head-size", "128", "--dtype", "bf16", "--causal", "both", "--pass", "fwd", "--warmup", "2",
           "--repeat", "5", "--db", str(tmp_path / "ce.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("verdict: pass") == 4, res.stdout[-5000:]
    from attnbench.results.store import ResultStore
    ce = [r for r in ResultStore(tmp_path / "ce.db").records() if r.info["method"] == "ulysses-ce"]
    assert len(ce) == 2 and all(r.info["ulysses_a2a"] == "copy-engine" and r.median_ms > 0 for r in ce)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copy_rows_is_a_strided_copy():
    # One head slice of every token, out of a (tokens, heads, d) shard into a dense block and back into another
    # shard's slice: the driver's 2-D copy must move exactly those bytes and leave the rest alone.
    from attnbench.distributed import copy_engine
    x = torch.randn(1000, 12, 64, device="cuda", dtype=torch.bfloat16)
    block = torch.empty(1000, 4, 64, device="cuda", dtype=torch.bfloat16)
    back = torch.zeros(1000, 12, 64, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    copy_engine.copy_rows(block, x[:, 4:8], stream)
    copy_engine.copy_rows(back[:, 8:12], block, stream)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(block, x[:, 4:8]) and torch.equal(back[:, 8:12], x[:, 4:8])
    assert not back[:, :8].any()
    with pytest.raises(ValueError, match="dense rows"):
        copy_engine.copy_rows(block.transpose(1, 2)[:, :4], x[:, :4, :4].transpose(1, 2), stream)


CE_CALLS = """
import os, torch, torch.distributed as dist
from attnbench.distributed import copy_engine
from attnbench.distributed.kernels import get_kernel
from attnbench.distributed.ulysses import ulysses_attention
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank); dist.init_process_group("nccl")
kernel, worst = get_kernel("sdpa-flash"), 0.0
with torch.no_grad():
    for call, s in enumerate((2048, 2048, 2048, 1024)):  # new inputs into the same buffers, then another shape
        g = torch.Generator(device="cuda").manual_seed(100 * call + rank)
        q = torch.randn(2, s, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(2, s, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        ref = ulysses_attention(q, k, v, kernel=kernel, causal=True, scale=0.088)
        got = copy_engine.forward(q, k, v, kernel=kernel, causal=True, scale=0.088, group=None, chunks=%d)
        torch.cuda.synchronize()
        worst = max(worst, (got.float() - ref.float()).abs().max().item())
print(f"rank {rank} worst {worst}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("chunks", [1, 2])
def test_copy_engine_calls_reuse_their_buffers(tmp_path, chunks):
    # Each call writes into the buffers the previous call's peers read from: every call must equal NCCL's Ulysses
    # on the same inputs (same kernel, same heads: bit for bit), through repeated calls and a change of shape.
    script = tmp_path / "ce.py"
    script.write_text(CE_CALLS % chunks)
    env = dict(os.environ, PYTHONPATH=_pythonpath(), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_free_port()), "--nproc_per_node", "2",
           str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("worst 0.0") == 2, res.stdout[-2000:]

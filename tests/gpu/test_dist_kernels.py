"""CUDA local kernels behind the context-parallel interface (one GPU), and the multi-GPU job (>= 2 GPUs).

Run on the GPU machine: PYTHONPATH=src python3 -m pytest -q -m gpu tests/gpu/test_dist_kernels.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbench.distributed.kernels import KernelUnavailable, get_kernel
from attnbench.distributed.reference import exact_attention
from attnbench.distributed.ring import merge

pytestmark = pytest.mark.gpu
KERNELS = ["flash", "efficient", "cudnn", "fa2", "fa3", "fa4"]


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
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=src, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "-m", "attnbench", "dist",
           "--method", "ring,zigzag,ulysses,usp,torch-cp", "--kernel", "flash", "--seq-lens", "8192",
           "--q-heads", "8", "--kv-heads", "8", "--head-size", "128", "--dtype", "bf16", "--causal", "both",
           "--pass", "fwd_bwd", "--warmup", "2", "--repeat", "5", "--db", str(tmp_path / "g.db")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("verdict: pass") == 10, res.stdout[-5000:]
    assert "verdict: fail" not in res.stdout

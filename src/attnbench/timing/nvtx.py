"""NVTX ranges (roctx on ROCm) that cost nothing when there is no GPU."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def nvtx_range(name: str, device: str | torch.device):
    """Push/pop an NVTX range named ``name`` around the block on a CUDA/ROCm device; no-op on CPU."""
    active = torch.device(device).type == "cuda" and torch.cuda.is_available()
    if active:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if active:
            torch.cuda.nvtx.range_pop()

"""Other context-parallel implementations run in the same job for comparison.

- ``torch-cp``: torch's native context parallel (``torch.distributed.tensor.experimental.context_parallel``,
  torch >= 2.7). It intercepts the CUDA SDPA ops (flash, efficient, cuDNN) only, so it is CUDA-only;
  its causal load balancing (head-tail) is the zigzag layout, and without causal it shards contiguously.
- ``rfa-ring`` / ``rfa-zigzag``: ring-flash-attn (``ring_flash_attn_func`` / ``zigzag_ring_flash_attn_func``),
  which calls FlashAttention-2 inside.
- ``yunchang``: USP from yunchang (``LongContextAttention`` after ``set_seq_parallel_pg``).
- ``torch-cp-flex``: torch's native context parallel on its FlexAttention path, which takes the packed
  documents' mask (``torch_cp_flex.py``).

Every peer is imported lazily; a missing package or device is a reason string, never an ImportError.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch
import torch.distributed as dist
import torch.nn.functional as F

SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                 "sdpa-cudnn": "CUDNN_ATTENTION"}


class PeerUnavailable(RuntimeError):
    """A peer implementation cannot run here; the message says why."""


def _need_cuda(device: torch.device, what: str) -> None:
    if device.type != "cuda":
        raise PeerUnavailable(f"{what} runs on CUDA only (NCCL and flash kernels); this run is on {device.type}")


def _need_module(module: str, pip_name: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise PeerUnavailable(f"{what} needs the {pip_name} package (pip install {pip_name}), not installed here")


def _expand_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=2)


def torch_cp(*, kernel_name: str, causal: bool, scale: float, seq_len: int, device: torch.device, world: int):
    """(fn, context factory, info) for torch's native CP with the SDPA kernel ``kernel_name``."""
    _need_cuda(device, "torch native context parallel (torch-cp)")
    if kernel_name not in SDPA_BACKENDS:
        raise PeerUnavailable(f"torch-cp dispatches {', '.join(SDPA_BACKENDS)} only, not kernel {kernel_name}")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as exc:
        raise PeerUnavailable(f"torch {torch.__version__} has no native context parallel (needs >= 2.7): {exc}") \
            from None
    options = _cp_options()
    mesh = init_device_mesh(device.type, (world,))
    backend = getattr(SDPBackend, SDPA_BACKENDS[kernel_name])

    def fn(q, k, v):
        groups = q.shape[2] // k.shape[2]
        qh, kh, vh = (t.transpose(1, 2) for t in (q, _expand_heads(k, groups), _expand_heads(v, groups)))
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale)
        return out.transpose(1, 2)

    @contextlib.contextmanager
    def context():
        # Load balancing (head-tail = zigzag) is what torch does for causal; it refuses it without causal.
        old = options.enable_load_balance
        options.enable_load_balance = causal
        marker = torch.zeros(1, 1, seq_len, device=device)  # sets the sequence length the balancer uses
        try:
            with context_parallel(mesh, buffers=[marker], buffer_seq_dims=[2], no_restore_buffers={marker}):
                yield
        finally:
            options.enable_load_balance = old

    info = {"peer": "torch.distributed.tensor.experimental.context_parallel", "sdpa_backend": SDPA_BACKENDS[kernel_name],
            "rotate_method": str(getattr(options, "rotate_method", "?")), "gqa": "expanded"}
    return fn, context, info


def _cp_options():
    for module in ("torch.distributed.tensor.experimental._context_parallel._attention",
                   "torch.distributed.tensor.experimental._attention"):
        try:
            return importlib.import_module(module)._cp_options
        except (ImportError, AttributeError):
            continue
    raise PeerUnavailable(f"torch {torch.__version__}: cannot find context parallel options (_cp_options)")


def ring_flash_attn(*, zigzag: bool, causal: bool, scale: float, device: torch.device):
    """(fn, None, info) for ring-flash-attn's ring or zigzag function (FA2 inside)."""
    what = "ring-flash-attn"
    _need_cuda(device, what)
    _need_module("ring_flash_attn", "ring-flash-attn", what)
    _need_module("flash_attn", "flash-attn", what)
    import ring_flash_attn as rfa

    func = rfa.zigzag_ring_flash_attn_func if zigzag else rfa.ring_flash_attn_func

    def fn(q, k, v):
        return func(q, k, v, softmax_scale=scale, causal=causal, group=None)

    return fn, None, {"peer": f"ring_flash_attn.{func.__name__}", "kernel": "flash-attn 2 (inside the package)"}


def yunchang_usp(*, ulysses_degree: int, causal: bool, scale: float, device: torch.device):
    """(fn, None, info) for yunchang's LongContextAttention (USP) with the same U x R mesh and layout."""
    what = "yunchang"
    _need_cuda(device, what)
    _need_module("yunchang", "yunchang", what)
    import yunchang

    world, rank = dist.get_world_size(), dist.get_rank()
    yunchang.set_seq_parallel_pg(ulysses_degree, world // ulysses_degree, rank, world)
    attn = yunchang.LongContextAttention(ring_impl_type="zigzag" if causal else "basic")

    def fn(q, k, v):
        return attn(q, k, v, softmax_scale=scale, causal=causal)

    return fn, None, {"peer": "yunchang.LongContextAttention", "ulysses_degree": ulysses_degree}

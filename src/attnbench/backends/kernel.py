"""Shared pieces of the adapters for third-party kernels: one importable entry point per backend,
the effective mask window, dense cases run through varlen kernels, and output normalisation.

Conventions every adapter keeps: outputs come back in the layout of the inputs (bshd dense, thd
packed); ``Outputs.lse`` is the natural-log log-sum-exp shaped (B, Hq, Sq) for dense cases and
(Hq, Tq) for packed ones, or None when the kernel does not give it in a known form.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.backends.base import Backend, autograd_closure
from attnbench.inputs import AttnInputs, cu_seqlens
from attnbench.spec import AttnSpec


class KernelBackend(Backend):
    """A backend that calls ``package.function``; unavailable (with a reason) when either is missing."""

    function: str = ""
    """Attribute of ``package`` that is the kernel entry point."""

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and self.function and not hasattr(importlib.import_module(self.package), self.function):
            version = self.version()
            return f"{self.package}{' ' + version if version else ''} has no {self.function}"
        return reason

    def kernel(self):
        """The entry point (imported lazily)."""
        return getattr(importlib.import_module(self.package), self.function)

    def base_info(self) -> dict:
        return super().base_info() | {"kernel": f"{self.package}.{self.function}"}


def effective_window(spec: AttnSpec) -> tuple[int, int]:
    """(left, right) keys each query may see around its lower-right-aligned diagonal, causal folded in;
    -1 = unbounded. Same rule as ``masks.keep_mask``."""
    left, right = spec.window if spec.has_window else (-1, -1)
    if spec.causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def accepts(fn, name: str) -> bool:
    """True if callable ``fn`` takes a parameter called ``name`` (or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def has_param(fn, name: str) -> bool:
    """True if ``fn`` names parameter ``name`` explicitly (not just through **kwargs)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class Packed:
    """How a case looks to a varlen kernel: packed tokens plus cu_seqlens.

    A dense case is flattened (B, S, H, D) -> (B*S, H, D) with uniform offsets so that varlen kernels
    can run it too; ``batch`` is then set and outputs are viewed back to (B, S, H, D).
    """

    cu_seqlens_q: torch.Tensor
    """int32 (N+1,) query offsets on the device."""
    cu_seqlens_k: torch.Tensor
    """int32 (N+1,) key offsets on the device."""
    max_seqlen_q: int
    """Longest query sequence."""
    max_seqlen_k: int
    """Longest key sequence."""
    seqlens_q: tuple[int, ...]
    """Every query length (host copy, for APIs that take lists)."""
    seqlens_k: tuple[int, ...]
    """Every key length."""
    batch: int | None = None
    """Dense batch size when the case was flattened; None for a real varlen case."""

    def flatten(self, t: torch.Tensor) -> torch.Tensor:
        """(B, S, H, D) -> (B*S, H, D); a no-op for packed inputs."""
        return t if self.batch is None else t.reshape(-1, *t.shape[2:])

    def unflatten(self, t: torch.Tensor) -> torch.Tensor:
        """(B*S, H, D) -> (B, S, H, D) view; a no-op for packed inputs."""
        return t if self.batch is None else t.view(self.batch, -1, *t.shape[1:])

    def unflatten_lse(self, lse: torch.Tensor | None) -> torch.Tensor | None:
        """(H, B*S) -> (B, H, S); None when the kernel gave another shape."""
        if lse is None or lse.dim() != 2:
            return None
        return lse if self.batch is None else lse.view(lse.shape[0], self.batch, -1).transpose(0, 1)


def packed(spec: AttnSpec, inputs: AttnInputs) -> Packed:
    """Packed view of a case (real varlen, or dense flattened)."""
    seqs = spec.sequences
    lq, lk = tuple(s for s, _ in seqs), tuple(s for _, s in seqs)
    if inputs.varlen:
        return Packed(cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k,
                      max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k, seqlens_q=lq, seqlens_k=lk)
    device = inputs.q.device
    return Packed(cu_seqlens_q=cu_seqlens(lq, device), cu_seqlens_k=cu_seqlens(lk, device),
                  max_seqlen_q=max(lq), max_seqlen_k=max(lk), seqlens_q=lq, seqlens_k=lk, batch=spec.batch)


def dense_closure(spec: AttnSpec, inputs: AttnInputs, fn, kwargs: dict, sink_arg: str = "") -> Callable:
    """Timed closure of a flash-attn style ``flash_attn_func(q, k, v, **kwargs)`` on bshd inputs
    (FA2, FA3, FA4), keeping the (B, H, Sq) LSE when the kernel returns one; a case's sinks go in as the
    kernel's ``sink_arg`` (FA4: ``learnable_sink``)."""
    lse_shape = (spec.batch, spec.heads_q, spec.seqlens_q[0])

    def forward(q, k, v, sinks=None):
        extra = {} if sinks is None else {sink_arg: sinks}
        out, lse = split_result(fn(q, k, v, **kwargs, **extra))
        return out, lse_if_shaped(lse, lse_shape)
    return autograd_closure(spec, inputs, forward)


def dense_functional(fn, kwargs: dict):
    """fn(q_bshd, k_bshd, v_bshd) -> out_bshd of a flash-attn style ``flash_attn_func`` for models (FA2, FA3):
    the model's tensors go in as they are (the kernels take any strides with a contiguous last dim)."""
    return lambda q, k, v: split_result(fn(q, k, v, **kwargs))[0]


def varlen_lse(lse: torch.Tensor | None, p: Packed, heads: int) -> torch.Tensor | None:
    """A varlen kernel's (H, total_q) LSE in the layout of the case (see ``Packed.unflatten_lse``)."""
    return p.unflatten_lse(lse_if_shaped(lse, (heads, sum(p.seqlens_q))))


def varlen_closure(spec: AttnSpec, inputs: AttnInputs, fn, kwargs: dict,
                   sink_arg: str = "") -> tuple[Callable, Packed]:
    """Timed closure of a flash-attn style ``*_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=,
    max_seqlen_q=, max_seqlen_k=, **kwargs)`` (FA2, FA3, FA4): dense cases are flattened in prepare; sinks
    as in ``dense_closure``."""
    p = packed(spec, inputs)

    def forward(q, k, v, sinks=None):
        extra = {} if sinks is None else {sink_arg: sinks}
        out, lse = split_result(fn(q, k, v, cu_seqlens_q=p.cu_seqlens_q, cu_seqlens_k=p.cu_seqlens_k,
                                   max_seqlen_q=p.max_seqlen_q, max_seqlen_k=p.max_seqlen_k, **kwargs, **extra))
        return p.unflatten(out), varlen_lse(lse, p, spec.heads_q)
    return autograd_closure(spec, inputs, forward, pre=lambda q, k, v: tuple(map(p.flatten, (q, k, v)))), p


def split_result(result) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A kernel's return value (out, or (out, lse, ...)) -> (out, lse or None)."""
    if isinstance(result, (tuple, list)):
        return result[0], (result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None)
    return result, None


def lse_if_shaped(lse: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    """``lse`` when it has the documented ``shape``; None otherwise (versions differ)."""
    return lse if lse is not None and tuple(lse.shape) == tuple(shape) else None


@functools.cache
def device_capability(device: str) -> tuple[int, int] | None:
    """CUDA compute capability of ``device`` (cached); None on CPU or ROCm."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(dev)


def layout_call(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """Call a ``tensor_layout="HND"|"NHD"`` kernel (SageAttention, SpargeAttn) on bshd tensors, in the layout
    the tensors are stored in: a model's (B, H, S, D) tensors viewed as bshd go in as HND, so no copy is
    added on the way (what a user passing the model's tensors straight to the kernel gets). Returns bshd."""
    hnd = not q.is_contiguous() and q.transpose(1, 2).is_contiguous()
    if hnd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = fn(q, k, v, tensor_layout="HND" if hnd else "NHD", **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2) if hnd else out

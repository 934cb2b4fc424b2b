"""Backends as plain attention functions, for models that call attention with their own tensors.

``Backend.prepare`` builds a zero-argument closure over fixed inputs, which is what kernel timing
needs. A model calls attention with new tensors every layer, so the swap needs the *function* a
backend wraps: ``functional(backend, spec)`` returns ``fn(q_bshd, k_bshd, v_bshd) -> out_bshd`` for
calls shaped like ``spec``, differentiable where the backend has a backward.

How the function is found, in order:

1. The backend defines the optional method ``functional(spec)`` (same contract as above). This is the
   clean extension point for adapters: the forward they already build inside ``prepare``, without the
   closure over fixed inputs. ``flex-sparse`` implements it.
2. The torch-only built-ins (``naive``, ``sdpa-*``) are built here from their module-level pieces, so
   their adapter files stay as they are.
3. Any other backend falls back to ``prepare`` on every call (forward only, no gradients): correct,
   but the backend's preparation lands inside the timed attention region; the e2e record says so
   (``info["e2e"]["functional"] == "prepare-per-call"``).

A recurrence backend (``Backend.operator == "recurrence"``, ``attnbench.linear.backends``) has its functional
form always: ``recurrence_functional`` returns its ``functional(spec)``, ``fn(tensors by name) -> (out,
final_state)``, for the call ``recurrence_spec`` describes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnbench.backends import registry
from attnbench.backends.base import Backend, BackendUnavailable, expand_kv_heads
from attnbench.inputs import AttnInputs
from attnbench.linear.spec import RecurrenceSpec
from attnbench.spec import AttnSpec, normalize_dtype

# Captured at import, before any swap patches F: the swap's own SDPA kernels must never route to itself.
ORIGINAL_SDPA = F.scaled_dot_product_attention

BshdFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

SDPA_KERNELS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                "sdpa-cudnn": "CUDNN_ATTENTION"}


def call_spec(q_bhsd: torch.Tensor, k_bhsd: torch.Tensor, v_bhsd: torch.Tensor, *, causal: bool,
              scale: float | None, needs_grad: bool, **variants) -> AttnSpec:
    """The AttnSpec of one model attention call on (B, H, S, D) tensors; ``variants``: window, softcap, alibi
    and sinks (true when the call passes sink logits) as AttnSpec takes them."""
    return AttnSpec(batch=q_bhsd.shape[0], seqlens_q=(q_bhsd.shape[2],), seqlens_k=(k_bhsd.shape[2],),
                    heads_q=q_bhsd.shape[1], heads_kv=k_bhsd.shape[1], head_dim=q_bhsd.shape[3],
                    head_dim_v=v_bhsd.shape[3], dtype=normalize_dtype(str(q_bhsd.dtype).removeprefix("torch.")),
                    causal=causal, scale=scale, layout="bhsd", pass_="fwd_bwd" if needs_grad else "fwd",
                    **{k: v for k, v in variants.items() if v is not None})


def recurrence_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, needs_grad: bool, l2norm: bool,
                    scale: float | None) -> RecurrenceSpec:
    """The RecurrenceSpec of one model GDN call on fla's layouts, q, k (B, T, H, d_k) and v (B, T, HV, d_v): a dense
    case from a zero state."""
    return RecurrenceSpec(kind="gdn", batch=q.shape[0], seqlens=(q.shape[1],), heads_qk=q.shape[2], heads_v=v.shape[2],
                          d_k=q.shape[3], d_v=v.shape[3], dtype=normalize_dtype(str(q.dtype).removeprefix("torch.")),
                          pass_="fwd_bwd" if needs_grad else "fwd", l2norm=l2norm, scale=scale)


def recurrence_functional(backend: Backend, spec: RecurrenceSpec, device: str | torch.device):
    """``fn(tensors by name) -> (out, final_state)``: recurrence backend ``backend``'s computation for calls like
    ``spec``; BackendUnavailable with the backend's own reason when it cannot run them on ``device``."""
    reason = backend.supports(spec, device)
    if reason:
        raise BackendUnavailable(f"{backend.name}: {reason}")
    return backend.functional(spec)


def functional(backend: str | Backend, spec: AttnSpec, device: str | torch.device) -> tuple[BshdFn, str]:
    """``(fn, how)``: the attention function of ``backend`` for calls like ``spec`` and which path built it.

    Raises BackendUnavailable with the backend's own reason when it cannot run ``spec`` on ``device``.
    """
    if isinstance(backend, str):
        backend = registry.get(backend)
    reason = backend.supports(spec, device)
    if reason:
        raise BackendUnavailable(f"{backend.name}: {reason}")
    if callable(getattr(backend, "functional", None)):
        return backend.functional(spec), "backend.functional"
    if backend.name == "naive":
        return _naive(spec), "builtin"
    if backend.name in SDPA_KERNELS:
        return _sdpa(SDPA_KERNELS[backend.name], spec), "builtin"
    if spec.pass_ != "fwd":
        raise BackendUnavailable(f"{backend.name}: no functional form (Backend.functional), so no gradients "
                                 "through the model; use --mode prefill")
    return _via_prepare(backend, spec), "prepare-per-call"


def _naive(spec: AttnSpec) -> BshdFn:
    from attnbench.backends.naive import Terms, _Mask, naive_attention
    built: dict = {}  # the mask and the variants' terms, built at the first call (on its device), like buffers

    def fn(q, k, v, sinks=None):
        if not built:
            sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
            built.update(mask=_Mask.build(sq, sk, spec.causal, spec.window, q.device),
                         terms=Terms.build(spec, sq, sk, q.device))
        return naive_attention(q, k, v, causal=spec.causal, window=spec.window, scale=spec.softmax_scale,
                               sinks=sinks, **built)
    return fn


def _sdpa(kernel: str, spec: AttnSpec) -> BshdFn:
    """One forced SDPA kernel; GQA native where the kernel takes it, else K/V heads expanded. A window, ALiBi and
    sinks go in as the float mask of ``backends.sdpa.variant_bias`` (the math kernel's capabilities)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnbench.backends.sdpa import sink_keys, variant_bias, with_sink_column
    backend = getattr(SDPBackend, kernel)
    groups = spec.heads_q // spec.heads_kv
    sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
    biased = spec.has_window or spec.sinks or spec.alibi is not None
    is_causal = spec.causal and sq == sk and not biased
    state: dict = {"native_gqa": groups > 1}

    def mask_for(q, sinks):
        if biased:  # built at the first call, on its device; a sink column per call (its gradient flows)
            if "bias" not in state:  # not setdefault: its argument would be built at every call
                state["bias"] = variant_bias(spec, q.device)
            bias = state["bias"]
            return bias if sinks is None else with_sink_column(bias, sinks)
        if spec.causal and sq != sk:
            from torch.nn.attention.bias import causal_lower_right
            return causal_lower_right(sq, sk)
        return None

    def call(q, k, v, native_gqa: bool, sinks):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if groups > 1 and not native_gqa:
            k, v = expand_kv_heads(k, groups, 1), expand_kv_heads(v, groups, 1)
        if sinks is not None:
            k, v = sink_keys(k, v)
        kw = {"enable_gqa": True} if native_gqa and groups > 1 else {}
        with sdpa_kernel([backend]):
            out = ORIGINAL_SDPA(q, k, v, attn_mask=mask_for(q, sinks), is_causal=is_causal, scale=spec.softmax_scale,
                                **kw)
        return out.transpose(1, 2)

    def fn(q, k, v, sinks=None):
        if state["native_gqa"]:
            try:
                return call(q, k, v, True, sinks)
            except RuntimeError:  # this kernel has no native GQA in this torch: expand from now on
                state["native_gqa"] = False
        return call(q, k, v, False, sinks)
    return fn


def _via_prepare(backend: Backend, spec: AttnSpec) -> BshdFn:
    """Forward through ``prepare`` on every call (backends without a functional form)."""
    prep_spec = spec.replace(layout="bshd")

    def fn(q, k, v, sinks=None):
        inputs = AttnInputs(q=q, k=k, v=v, dout=q.new_empty(0), max_seqlen_q=q.shape[1], max_seqlen_k=k.shape[1],
                            sinks=sinks)
        return backend.prepare(prep_spec, inputs).fn().out
    return fn

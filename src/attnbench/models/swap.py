"""The one attention swap: route a model's attention calls to an attnbench backend, without editing it.

Inside ``with AttnSwap("sdpa-flash") as swap:`` every attention call of a supported model goes to
``swap`` (which counts it, optionally times it, and marks it with an NVTX range), and ``swap``
calls the backend's attention function (see ``functional.py``). The call sites it covers:

* ``attention(q, k, v, causal=, scale=)`` in this module: the swap point attnbench's own Llama calls.
  Outside any swap it is plain SDPA.
* diffusers processors that call ``F.scaled_dot_product_attention`` (CogVideoX's
  ``CogVideoXAttnProcessor2_0``): the name ``F`` in each module of ``sdpa_modules`` (default
  ``diffusers.models.attention_processor``) is replaced by a proxy of ``torch.nn.functional`` whose
  ``scaled_dot_product_attention`` routes here. ``patch_torch=True`` patches
  ``torch.nn.functional.scaled_dot_product_attention`` itself, for any other model.
* diffusers processors that call ``dispatch_attention_fn`` (Wan and other new models): the function of
  the dispatcher's active backend (normally ``native``) is replaced in diffusers' backend registry
  (``diffusers.models.attention_dispatch._AttentionBackendRegistry``; private in diffusers 0.42).
* transformers models: ``register_transformers()`` registers ``"attnbench"`` with
  ``transformers.AttentionInterface``; select it with ``model.set_attn_implementation("attnbench")``.

Calls the swap cannot serve as asked (an explicit ``attn_mask``, dropout) run the original SDPA and
are counted in ``unrouted``, so a benchmark can prove that every call was routed. Patches are undone
on exit, also on error. Attention time: CUDA events (perf_counter on CPU) around every forward call
and, through a pair of autograd markers, around its backward.

A hybrid model's recurrent layers (Gated DeltaNet) call the second swap point, ``recurrence(q, k, v, g, beta)``;
the swap runs it with its recurrence backend (``AttnSwap(..., recurrence="torch-chunked")``, an attnbench
backend whose ``operator`` is ``recurrence``), counts it apart (``recurrence_calls``) and times it on clocks of
its own (``recurrence_ms``), so that the attention's time stays the attention calls' alone. Outside any swap it
runs the default recurrence backend, untimed.
"""

from __future__ import annotations

import importlib
import sys
import time
import types
from collections import Counter
from contextlib import contextmanager

import torch

from attnbench.backends import registry
from attnbench.models.config import DEFAULT_RECURRENCE
from attnbench.models.functional import (
    ORIGINAL_SDPA,
    call_spec,
    functional,
    recurrence_functional,
    recurrence_spec,
)

DEFAULT_SDPA_MODULES = ("diffusers.models.attention_processor",)
_ACTIVE: list[AttnSwap] = []
_UNSWAPPED: dict = {}
"""Recurrence functions of calls made outside any swap, by call signature."""


def attention(q_bhsd: torch.Tensor, k_bhsd: torch.Tensor, v_bhsd: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, **variants) -> torch.Tensor:
    """softmax(q k^T * scale) v on (B, H, S, D) tensors (GQA when k/v have fewer heads); (B, Hq, Sq, Dv).

    ``variants``: ``window`` (left, right), ``softcap``, ``alibi`` (slopes), ``sinks`` ((Hq,) fp32 tensor), as in
    ``attnbench.features``. Routed to the innermost active AttnSwap; without one, plain SDPA, or naive
    attention when a variant is given.
    """
    if _ACTIVE:
        return _ACTIVE[-1](q_bhsd, k_bhsd, v_bhsd, causal=causal, scale=scale, **variants)
    if any(v is not None for v in variants.values()):
        with AttnSwap("naive") as swap:
            return swap(q_bhsd, k_bhsd, v_bhsd, causal=causal, scale=scale, **variants)
    gqa = {"enable_gqa": True} if k_bhsd.shape[1] != q_bhsd.shape[1] else {}
    return ORIGINAL_SDPA(q_bhsd, k_bhsd, v_bhsd, is_causal=causal, scale=scale, **gqa)


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
               l2norm: bool = True, scale: float | None = None) -> torch.Tensor:
    """Gated DeltaNet's recurrence on fla's layouts: q, k (B, T, H, d_k), v (B, T, HV, d_v), the log-decay g and
    beta (B, T, HV); returns the output (B, T, HV, d_v) in v's dtype, from a zero state (``attnbench.linear.reference``
    writes the recurrence out). ``l2norm``: q and k L2-normalised inside the op (fla's ``use_qk_l2norm_in_kernel``,
    as Qwen3-Next calls it); ``scale``: None = 1/sqrt(d_k).

    Routed to the innermost active AttnSwap's recurrence backend; without one, DEFAULT_RECURRENCE, untimed.
    """
    if _ACTIVE:
        return _ACTIVE[-1].recurrence(q, k, v, g, beta, l2norm=l2norm, scale=scale)
    spec = recurrence_spec(q, k, v, needs_grad=False, l2norm=l2norm, scale=scale)
    key = (spec.replace(pass_="fwd"), q.device)
    if key not in _UNSWAPPED:
        _UNSWAPPED[key] = recurrence_functional(registry.get(DEFAULT_RECURRENCE), spec, q.device)
    return _UNSWAPPED[key]({"q": q, "k": k, "v": v, "g": g, "beta": beta})[0].to(v.dtype)


@contextmanager
def nvtx_range(name: str, enabled: bool):
    """An NVTX range for nsys (no-op when disabled, e.g. on CPU)."""
    if not enabled:
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


class _Clock:
    """Start/stop marks: CUDA events on a GPU, perf_counter on CPU; sums to milliseconds."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.pairs: list[list] = []

    def start(self) -> list:
        mark = torch.cuda.Event(enable_timing=True) if self.cuda else None
        if mark is not None:
            mark.record()
        pair = [mark if self.cuda else time.perf_counter(), None]
        self.pairs.append(pair)
        return pair

    def stop(self, pair: list) -> None:
        if self.cuda:
            pair[1] = torch.cuda.Event(enable_timing=True)
            pair[1].record()
        else:
            pair[1] = time.perf_counter()

    def total_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self.pairs if b is not None)
        return sum((b - a) * 1e3 for a, b in self.pairs if b is not None)


class _Timer:
    """The forward and backward clocks of one kind of call (attention, recurrence) and its NVTX name."""

    def __init__(self, label: str):
        self.label = label
        """NVTX range of a forward call; the backward's adds ``-bwd`` to its first word (``attn-bwd:sdpa-flash``)."""
        self.nvtx = False
        self.reset(False)

    def reset(self, cuda: bool) -> None:
        self.fwd, self.bwd = _Clock(cuda), _Clock(cuda)

    def ms(self) -> tuple[float, float]:
        return self.fwd.total_ms(), self.bwd.total_ms()

    @property
    def bwd_label(self) -> str:
        kind, _, name = self.label.partition(":")
        return f"{kind}-bwd:{name}"


class _BwdStop(torch.autograd.Function):
    """Identity on a call's inputs; its backward runs after the call's backward (once every input's gradient is
    in): stops the bwd clock."""

    @staticmethod
    def forward(ctx, timer, box, *inputs):
        ctx.timer, ctx.box = timer, box
        return tuple(x.view_as(x) for x in inputs)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.box:
            ctx.timer.bwd.stop(ctx.box.pop())
            if ctx.timer.nvtx:
                torch.cuda.nvtx.range_pop()
        return None, None, *grads


class _BwdStart(torch.autograd.Function):
    """Identity on the output; its backward runs first: starts the bwd clock."""

    @staticmethod
    def forward(ctx, timer, box, out):
        ctx.timer, ctx.box = timer, box
        return out.view_as(out)

    @staticmethod
    def backward(ctx, dout):
        if ctx.timer.nvtx:
            torch.cuda.nvtx.range_push(ctx.timer.bwd_label)
        ctx.box.append(ctx.timer.bwd.start())
        return None, None, dout


class AttnSwap:
    """Context manager routing attention calls to backend ``backend`` (an attnbench registry name)."""

    def __init__(self, backend: str = "sdpa-math", *, timed: bool = False, nvtx: bool = True,
                 sdpa_modules: tuple[str, ...] = DEFAULT_SDPA_MODULES, patch_torch: bool = False,
                 dispatcher: bool = True, options: dict | None = None, recurrence: str = DEFAULT_RECURRENCE,
                 recurrence_options: dict | None = None):
        self.backend_name = backend
        self.backend = registry.get(backend, options)  # ``options``: the backend's constructor options
        self.recurrence_name = recurrence
        self.recurrence_backend = registry.get(recurrence, recurrence_options)
        if self.recurrence_backend.operator != "recurrence":
            raise ValueError(f"{recurrence} runs {self.recurrence_backend.operator} calls, not a recurrence; "
                             f"the recurrence backends: {', '.join(registry.of_operator('recurrence'))}")
        self.recurrence_fns: dict[tuple, tuple] = {}
        """Recurrence function per call signature: (fn, spec)."""
        self.timed, self.nvtx_wanted = timed, nvtx
        self.sdpa_modules, self.patch_torch, self.dispatcher = sdpa_modules, patch_torch, dispatcher
        self.fns: dict[tuple, tuple] = {}
        """Attention function per call signature: (fn, how it was built)."""
        self.nvtx = False
        self.last_spec = None
        """The spec of the latest new call signature (known even when the backend refused it)."""
        self._undo: list = []
        self._inside = False
        self.reset()

    def reset(self) -> None:
        """Clear counts and clocks (e.g. after warm-up)."""
        self.calls, self.unrouted, self.recurrence_calls = 0, 0, 0
        self.shapes: Counter = Counter()
        self.recurrence_shapes: Counter = Counter()
        """RecurrenceSpec -> calls."""
        self._attn = _Timer(f"attn:{self.backend_name}")
        self._recur = _Timer(f"recurrence:{self.recurrence_name}")

    # ---- the routed call ------------------------------------------------------------------------
    def __call__(self, q_bhsd, k_bhsd, v_bhsd, *, causal: bool = False, scale: float | None = None,
                 window: tuple[int, int] | None = None, softcap: float | None = None,
                 alibi: tuple[float, ...] | None = None, sinks: torch.Tensor | None = None):
        tensors = (q_bhsd, k_bhsd, v_bhsd) + (() if sinks is None else (sinks,))
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        variants = {"window": window, "softcap": softcap, "alibi": alibi}
        key = (tuple(q_bhsd.shape), tuple(k_bhsd.shape), tuple(v_bhsd.shape), q_bhsd.dtype, causal, scale,
               needs_grad, q_bhsd.device, *variants.values(), sinks is not None)
        if key not in self.fns:
            spec = call_spec(q_bhsd, k_bhsd, v_bhsd, causal=causal, scale=scale, needs_grad=needs_grad,
                             sinks=sinks is not None, **variants)
            self.last_spec = spec
            self.fns[key] = (*functional(self.backend, spec, q_bhsd.device), spec)
        fn, _, spec = self.fns[key]
        self.calls += 1
        self.shapes[spec] += 1
        extra = {} if sinks is None else {"sinks": sinks}
        return self._timed(self._attn, needs_grad, lambda q, k, v: fn(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **extra).transpose(1, 2), q_bhsd, k_bhsd, v_bhsd)

    def recurrence(self, q, k, v, g, beta, *, l2norm: bool = True, scale: float | None = None) -> torch.Tensor:
        """A recurrent layer's call (module function ``recurrence``) through the recurrence backend, counted and
        timed apart from the attention."""
        tensors = (q, k, v, g, beta)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        key = (*(tuple(t.shape) for t in tensors), *(t.dtype for t in tensors), q.device, needs_grad, l2norm, scale)
        if key not in self.recurrence_fns:
            spec = recurrence_spec(q, k, v, needs_grad=needs_grad, l2norm=l2norm, scale=scale)
            self.recurrence_fns[key] = (recurrence_functional(self.recurrence_backend, spec, q.device), spec)
        fn, spec = self.recurrence_fns[key]
        self.recurrence_calls += 1
        self.recurrence_shapes[spec] += 1
        return self._timed(self._recur, needs_grad, lambda *t: fn(dict(zip(("q", "k", "v", "g", "beta"), t)))[0]
                           .to(v.dtype), *tensors)

    def _timed(self, timer: _Timer, needs_grad: bool, call, *inputs) -> torch.Tensor:
        """``call(*inputs)`` inside ``timer``'s NVTX range and forward clock, its backward between the markers."""
        cuda = inputs[0].is_cuda
        self.nvtx = timer.nvtx = self.nvtx_wanted and cuda
        if self.timed and timer.fwd.cuda != cuda:
            timer.reset(cuda)
        box: list = []
        if needs_grad and self.timed:
            inputs = _BwdStop.apply(timer, box, *inputs)
        self._inside = True
        try:
            with nvtx_range(timer.label, self.nvtx):
                pair = timer.fwd.start() if self.timed else None
                out = call(*inputs)
                if pair is not None:
                    timer.fwd.stop(pair)
        finally:
            self._inside = False
        if needs_grad and self.timed:
            out = _BwdStart.apply(timer, box, out)
        return out

    def attention_ms(self) -> tuple[float, float]:
        """(forward, backward) milliseconds spent in attention since the last reset (synchronizes)."""
        return self._attn.ms()

    def recurrence_ms(self) -> tuple[float, float]:
        """(forward, backward) milliseconds spent in recurrences since the last reset (synchronizes)."""
        return self._recur.ms()

    @property
    def how(self) -> str:
        """How the backend's attention function was built (functional.py), joined over call shapes."""
        return ",".join(sorted({how for _, how, _ in self.fns.values()})) or "-"

    # ---- call sites -----------------------------------------------------------------------------
    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False, **kwargs):
        """Drop-in ``F.scaled_dot_product_attention`` (B, H, S, D) routed to the backend when it can be."""
        if self._inside or attn_mask is not None or dropout_p or kwargs:
            if not self._inside:
                self.unrouted += 1
            return ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                 scale=scale, enable_gqa=enable_gqa, **kwargs)
        return self(query, key, value, causal=is_causal, scale=scale)

    def dispatch(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, _parallel_config=None, **kwargs):
        """diffusers dispatcher backend signature: (B, S, H, D) tensors in and out."""
        if attn_mask is not None or dropout_p or _parallel_config is not None or kwargs.get("return_lse"):
            self.unrouted += 1
            return self._saved_dispatch(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                        _parallel_config=_parallel_config, **kwargs)
        out = self(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal, scale=scale)
        return out.transpose(1, 2)

    def __enter__(self) -> AttnSwap:
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if _ACTIVE and _ACTIVE[-1] is self:
            _ACTIVE.pop()
        self._uninstall()

    def _install(self) -> None:
        for name in self.sdpa_modules:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "F", None) is not None:
                self._set(module, "F", _FunctionalProxy(module.F, self.sdpa))
        if self.patch_torch:
            self._set(torch.nn.functional, "scaled_dot_product_attention", self.sdpa)
        dispatch_mod = sys.modules.get("diffusers.models.attention_dispatch")
        if self.dispatcher and dispatch_mod is not None:
            reg = dispatch_mod._AttentionBackendRegistry
            active = reg._active_backend
            self._saved_dispatch = reg._backends[active]
            self._set(reg._backends, active, self.dispatch, item=True)
        if "transformers" in sys.modules:
            register_transformers()

    def _set(self, target, name, value, item: bool = False) -> None:
        old = target[name] if item else getattr(target, name)
        self._undo.append((target, name, old, item))
        if item:
            target[name] = value
        else:
            setattr(target, name, value)

    def _uninstall(self) -> None:
        while self._undo:
            target, name, old, item = self._undo.pop()
            if item:
                target[name] = old
            else:
                setattr(target, name, old)


class _FunctionalProxy(types.ModuleType):
    """Stands in for ``torch.nn.functional`` in one module; only SDPA differs."""

    def __init__(self, real, sdpa):
        super().__init__(real.__name__)
        self._real, self.scaled_dot_product_attention = real, sdpa

    def __getattr__(self, name):
        return getattr(self._real, name)


def transformers_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers ``AttentionInterface`` function: (B, H, S, D) in, ((B, S, H, D) out, None).

    Causal follows ``module.is_causal`` (transformers' convention); padding masks are not supported:
    with a mask, the call is causal only when the model is causal and queries and keys have one length.
    """
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    if attention_mask is not None and not (causal and query.shape[2] == key.shape[2]):
        raise NotImplementedError("attnbench's transformers attention takes no padding masks")
    if dropout:
        raise NotImplementedError("attnbench's transformers attention runs without dropout (eval mode)")
    out = attention(query, key, value, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_transformers(name: str = "attnbench") -> None:
    """Register ``transformers_attention`` under ``name`` with transformers' AttentionInterface."""
    transformers = importlib.import_module("transformers")
    transformers.AttentionInterface.register(name, transformers_attention)

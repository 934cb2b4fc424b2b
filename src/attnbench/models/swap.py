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
from attnbench.models.functional import ORIGINAL_SDPA, call_spec, functional

DEFAULT_SDPA_MODULES = ("diffusers.models.attention_processor",)
_ACTIVE: list[AttnSwap] = []


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


class _BwdStop(torch.autograd.Function):
    """Identity on q, k, v; its backward runs after the attention backward: stops the bwd clock."""

    @staticmethod
    def forward(ctx, swap, box, q, k, v):
        ctx.swap, ctx.box = swap, box
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        if ctx.box:
            ctx.swap._bwd_clock.stop(ctx.box.pop())
            if ctx.swap.nvtx:
                torch.cuda.nvtx.range_pop()
        return None, None, dq, dk, dv


class _BwdStart(torch.autograd.Function):
    """Identity on the output; its backward runs first: starts the bwd clock."""

    @staticmethod
    def forward(ctx, swap, box, out):
        ctx.swap, ctx.box = swap, box
        return out.view_as(out)

    @staticmethod
    def backward(ctx, dout):
        if ctx.swap.nvtx:
            torch.cuda.nvtx.range_push(f"attn-bwd:{ctx.swap.backend_name}")
        ctx.box.append(ctx.swap._bwd_clock.start())
        return None, None, dout


class AttnSwap:
    """Context manager routing attention calls to backend ``backend`` (an attnbench registry name)."""

    def __init__(self, backend: str = "sdpa-math", *, timed: bool = False, nvtx: bool = True,
                 sdpa_modules: tuple[str, ...] = DEFAULT_SDPA_MODULES, patch_torch: bool = False,
                 dispatcher: bool = True, options: dict | None = None):
        self.backend_name = backend
        self.backend = registry.get(backend, options)  # ``options``: the backend's constructor options
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
        self.calls, self.unrouted = 0, 0
        self.shapes: Counter = Counter()
        self._fwd_clock = _Clock(False)
        self._bwd_clock = _Clock(False)

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
        cuda = q_bhsd.is_cuda
        self.nvtx = self.nvtx_wanted and cuda
        if self.timed and self._fwd_clock.cuda != cuda:
            self._fwd_clock, self._bwd_clock = _Clock(cuda), _Clock(cuda)
        box: list = []
        if needs_grad and self.timed:
            q_bhsd, k_bhsd, v_bhsd = _BwdStop.apply(self, box, q_bhsd, k_bhsd, v_bhsd)
        self._inside = True
        try:
            with nvtx_range(f"attn:{self.backend_name}", self.nvtx):
                pair = self._fwd_clock.start() if self.timed else None
                extra = {} if sinks is None else {"sinks": sinks}
                out = fn(q_bhsd.transpose(1, 2), k_bhsd.transpose(1, 2), v_bhsd.transpose(1, 2), **extra).transpose(1, 2)
                if pair is not None:
                    self._fwd_clock.stop(pair)
        finally:
            self._inside = False
        if needs_grad and self.timed:
            out = _BwdStart.apply(self, box, out)
        return out

    def attention_ms(self) -> tuple[float, float]:
        """(forward, backward) milliseconds spent in attention since the last reset (synchronizes)."""
        return self._fwd_clock.total_ms(), self._bwd_clock.total_ms()

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

"""``flex``: torch.nn.attention.flex_attention, compiled once per (shape, mask) in ``prepare``.

Masks are block masks built in ``prepare`` and cached (keyed by the mask parameters and the device):
- causal, lower-right aligned: key j is kept for query i iff j <= i + Sk - Sq;
- sliding window (left, right) around that diagonal;
- varlen: a document mask over the packed tokens (batch 1, every sequence of the group, repeated
  ``batch`` times), with causal/window applied inside each document at its own alignment;
- sliding tile attention (``spec.sta``): the STA mask from its tile table, one block mask per head when
  the heads' windows differ — the mask FastVideo's own test checks its STA kernel against.
GQA goes through ``enable_gqa``. Forward and backward.

The variants of today's models (``attnbench.features``): softcap and ALiBi are a ``score_mod`` (the variants'
own definitions, composed), built in ``prepare`` with the ALiBi slopes as a captured tensor; sinks are not a
FlexAttention argument, so the adapter does what users do: it asks for the LSE and rescales,
``out · sigmoid(lse − sink)``, returning ``logaddexp(lse, sink)`` as the LSE — both differentiable, so the sinks
get their gradient through FlexAttention's LSE backward.

The first call happens in ``prepare`` and its wall time (compilation included) is recorded as
``info["compile_ms"]`` (``first_call_ms`` when not compiled); the timed closure only calls the
compiled function. ``compile=False`` runs flex eagerly (an unfused reference that materialises the
scores: for testing, not for timing). CUDA by default; ``FlexBackend(cpu=True)`` adds CPU.
Dynamo's recompile limit is lifted while ``prepare`` compiles, so a long sweep of shapes never falls
back to eager silently; ``fullgraph=True`` makes any graph break an error instead.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import time
from dataclasses import replace

import torch

from attnbench.backends.base import Backend, Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import effective_window
from attnbench.features.alibi import alibi_bias
from attnbench.features.softcap import softcap as apply_softcap
from attnbench.inputs import AttnInputs
from attnbench.serving import tree_keep
from attnbench.spec import AttnSpec

# Above this many (query, key) pairs the block mask is built with a compiled kernel instead of a dense
# (Q, KV) boolean grid (which would take Q*KV bytes plus int64 temporaries).
_DENSE_MASK_LIMIT = 1 << 28


def band(rel: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Keep mask for keys at offset ``rel`` from the aligned diagonal; -1 = unbounded side."""
    keep = rel == rel  # all True, same shape and device
    if left >= 0:
        keep = keep & (rel >= -left)
    if right >= 0:
        keep = keep & (rel <= right)
    return keep


def dense_mask_mod(sq: int, sk: int, left: int, right: int):
    """mask_mod of one (Sq, Sk) sequence; None when nothing is masked."""
    if left < 0 and right < 0:
        return None
    offset = sk - sq

    def mask_mod(b, h, q_idx, kv_idx):
        return band(kv_idx - q_idx - offset, left, right)
    return mask_mod


def document_positions(seqs: tuple[tuple[int, int], ...], device):
    """Over packed documents: (the document of each query, of each key, and ``rel(d, q_idx, kv_idx)``, the key's
    position minus the query's lower-right aligned position inside the query's document ``d = doc_q[q_idx]``)."""
    lq = torch.tensor([s for s, _ in seqs], device=device)
    lk = torch.tensor([s for _, s in seqs], device=device)
    doc_q = torch.repeat_interleave(torch.arange(len(seqs), device=device), lq)
    doc_k = torch.repeat_interleave(torch.arange(len(seqs), device=device), lk)
    start_q, start_k = torch.cumsum(lq, 0) - lq, torch.cumsum(lk, 0) - lk
    offset = lk - lq

    def rel(d, q_idx, kv_idx):
        return (kv_idx - start_k[d]) - (q_idx - start_q[d]) - offset[d]
    return doc_q, doc_k, rel


def document_mask_mod(seqs: tuple[tuple[int, int], ...], left: int, right: int, device):
    """mask_mod over packed documents: same document, and the band inside it at its own alignment."""
    doc_q, doc_k, rel = document_positions(seqs, device)

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        return (d == doc_k[kv_idx]) & band(rel(d, q_idx, kv_idx), left, right)
    return mask_mod


def serving_mask_mod(seqs: tuple[tuple[int, int], ...], prefix: int, tree, device):
    """mask_mod of a serving batch over packed keys laid out as [shared prefix, request 0's own keys, ...]: every
    query sees the prefix, and inside its own request the keys up to its lower-right aligned position, or, with a
    ``tree``, its cached keys and its ancestors among the new tokens."""
    own = tuple((sq, sk - prefix) for sq, sk in seqs)
    doc_q, doc_k, rel = document_positions(own, device)
    keep_new = None if tree is None else tree_keep(tree, device)
    n = 0 if tree is None else len(tree)
    lq = torch.tensor([s for s, _ in own], device=device)
    start_q = torch.cumsum(lq, 0) - lq

    def mask_mod(b, h, q_idx, kv_idx):
        in_prefix = kv_idx < prefix
        own_kv = (kv_idx - prefix).clamp(min=0)
        d = doc_q[q_idx]
        position = rel(d, q_idx, own_kv)  # key minus aligned query position: <= 0 is causal
        if keep_new is None:
            inside = position <= 0
        else:  # new token i sees key j of the new tokens (position j - i) if j is i or an ancestor
            i = q_idx - start_q[d]
            j = (i + position).clamp(0, n - 1)
            inside = (i + position < 0) | keep_new[i.clamp(0, n - 1), j]
        return in_prefix | ((d == doc_k[own_kv]) & ~in_prefix & inside)
    return mask_mod


def variant_score_mod(spec: AttnSpec, device):
    """FlexAttention ``score_mod`` of the case's softcap and ALiBi (None without either): the definitions of
    ``attnbench.features`` applied to the scaled score, ALiBi on positions within each sequence (a packed
    group's documents each at their own lower-right alignment)."""
    if spec.softcap is None and spec.alibi is None:
        return None
    cap = spec.softcap
    slopes = None if spec.alibi is None else torch.tensor(spec.alibi, dtype=torch.float32, device=device)
    position = _relative_position(spec, device)

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = apply_softcap(score, cap)
        if slopes is not None:  # the bias in float32, added in the scores' dtype
            score = score + alibi_bias(slopes[h], position(q_idx, kv_idx)).to(score.dtype)
        return score
    return score_mod


def _relative_position(spec: AttnSpec, device):
    """(q_idx, kv_idx) -> key position minus aligned query position, as float32, for dense or packed inputs
    (pairs across packed documents are masked: any finite value does for them)."""
    if not spec.is_varlen:
        offset = spec.seqlens_k[0] - spec.seqlens_q[0]
        return lambda q_idx, kv_idx: (kv_idx - q_idx - offset).to(torch.float32)
    doc_q, _, rel = document_positions(tuple(spec.sequences), device)
    return lambda q_idx, kv_idx: rel(doc_q[q_idx], q_idx, kv_idx).to(torch.float32)


def sta_mask_mod(tm, heads: int, device):
    """mask_mod of a sliding tile mask (``attnbench.sta.TileMask``): the query's and key's tiles looked up in
    the (heads, tiles, tiles) tile mask; pairs with a text token are kept."""
    tile_keep = tm.tile_keep(heads, device)
    last = tile_keep.shape[1] - 1
    video, tokens = tm.video_tokens, tm.tile_tokens
    per_head = len(tm.windows) > 1

    def mask_mod(b, h, q_idx, kv_idx):
        keep = tile_keep[h if per_head else 0, (q_idx // tokens).clamp(max=last), (kv_idx // tokens).clamp(max=last)]
        return keep | (q_idx >= video) | (kv_idx >= video)
    return mask_mod


@functools.lru_cache(maxsize=32)
def block_mask(seqs: tuple[tuple[int, int], ...], varlen: bool, window: tuple[int, int], device: str,
               sta=None, heads: int = 1, prefix: int = 0, tree: tuple[int, ...] | None = None):
    """Cached BlockMask for the sequences (one (Sq, Sk) pair when dense), or None for no mask; ``sta``: a
    sliding tile mask of ``heads`` query heads (one block mask per head when the heads' windows differ);
    ``prefix``, ``tree``: a serving batch's shared prefix (stored once, before the requests' own keys) and
    speculative tree (``serving_mask_mod``)."""
    from torch.nn.attention.flex_attention import create_block_mask
    left, right = window
    if prefix or tree is not None:
        q_len, kv_len = sum(s for s, _ in seqs), prefix + sum(s - prefix for _, s in seqs)
        with _unlimited_recompiles():
            return create_block_mask(serving_mask_mod(seqs, prefix, tree, device), None, None, q_len, kv_len,
                                     device=device, _compile=torch.device(device).type == "cuda")
    if sta is not None:
        (q_len, kv_len), = seqs
        with _unlimited_recompiles():
            return create_block_mask(sta_mask_mod(sta, heads, device), None, heads if len(sta.windows) > 1 else None,
                                     q_len, kv_len, device=device,
                                     _compile=q_len * kv_len > _DENSE_MASK_LIMIT and torch.device(device).type == "cuda")
    if varlen:
        mod = document_mask_mod(seqs, left, right, device)
        q_len, kv_len = sum(s for s, _ in seqs), sum(s for _, s in seqs)
    else:
        (q_len, kv_len), = seqs
        mod = dense_mask_mod(q_len, kv_len, left, right)
    if mod is None:
        return None
    big = q_len * kv_len > _DENSE_MASK_LIMIT and torch.device(device).type == "cuda"
    with _unlimited_recompiles():
        return create_block_mask(mod, None, None, q_len, kv_len, device=device, _compile=big)


@functools.cache
def compiled_flex(backend: str, mode: str | None):
    """torch.compile'd flex_attention (shared; dynamo specialises it per shape and mask)."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, backend=backend, mode=mode, dynamic=False, fullgraph=True)


@contextlib.contextmanager
def _unlimited_recompiles():
    """Lift dynamo's per-function recompile limit (a sweep compiles one graph per shape)."""
    import torch._dynamo
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    with cfg.patch(**{name: max(getattr(cfg, name), 1 << 16)}):
        yield


def compile_backends() -> tuple[str, ...]:
    """The backends torch.compile knows here (``torch._dynamo.list_backends``, the debugging ones such as eager
    included, dynamo's own test doubles not)."""
    import torch._dynamo
    return tuple(sorted(b for b in torch._dynamo.list_backends(exclude_tags=()) if not b.endswith("TESTING_ONLY")))


def compile_modes() -> tuple[str, ...]:
    """The modes torch.compile takes (``default`` and inductor's, e.g. max-autotune)."""
    import torch._inductor
    return tuple(dict.fromkeys(["default", *torch._inductor.list_mode_options()]))


def _cxx_compiler() -> str | None:
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


FLEX_MIN_HEAD_DIM = 16
"""The compiled CUDA kernel refuses smaller head sizes (seen with torch 2.11: "NYI: embedding
dimension of the query, key, and value must be at least 16")."""


def flex_head_dim_reason() -> str:
    return f"head size < {FLEX_MIN_HEAD_DIM} not supported by the compiled CUDA kernel"


class FlexBackend(Backend):
    """FlexAttention. ``compile=False`` runs it eagerly; ``compile_backend`` / ``mode`` go to torch.compile;
    ``cpu=True`` also offers it on CPU (off by default: inductor takes 20-40 s per shape there, which
    would dominate every CPU sweep; and torch has no flex backward on CPU)."""

    name = "flex"
    description = "torch FlexAttention, torch.compile'd per shape; block masks for causal/window/varlen"
    capabilities = Capabilities(devices=("cuda",), varlen=True, window=True, tile_mask=True, sinks=True, softcap=True,
                                alibi=True, gate=True, shared_prefix=True, tree=True)
    device_options = {"cpu": "off by default: compiling takes 20-40 s a shape there, and it runs forward only"}

    option_choices = {"compile_backend": compile_backends, "mode": compile_modes}

    def __init__(self, *, compile: bool = True, compile_backend: str = "inductor", mode: str | None = None,
                 cpu: bool = False):
        self.compile, self.compile_backend, self.mode = compile, compile_backend, mode
        self.compiles_ahead = compile and compile_backend == "inductor"
        if cpu:
            self.capabilities = replace(type(self).capabilities, devices=("cpu", "cuda"))

    def unavailable_reason(self) -> str | None:
        # find_spec, not import: importing flex pulls in dynamo (seconds) just to list backends
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs torch >= 2.5)"
        return None

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        dev = torch.device(device).type
        if dev == "cuda" and spec.dtype == "fp64":
            return "dtype fp64 not supported by the compiled CUDA kernel (fp16/bf16/fp32)"
        if dev == "cuda" and min(spec.head_dim, spec.head_dim_v) < FLEX_MIN_HEAD_DIM:
            return flex_head_dim_reason()
        if (spec.shared_prefix or spec.tree is not None) and (spec.has_window or not spec.is_varlen):
            return "a shared prefix or tree takes a batch of requests (grouped) without a window here"
        if dev == "cpu" and spec.pass_ != "fwd":
            return f"FlexAttention has no backward on CPU (torch {torch.__version__})"
        if dev == "cpu" and self.compile and self.compile_backend == "inductor" and _cxx_compiler() is None:
            return "torch.compile on CPU needs a C++ compiler (none on PATH); FlexBackend(compile=False) runs eagerly"
        return None

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        from torch.nn.attention.flex_attention import flex_attention
        device = inputs.q.device
        bm = block_mask(tuple(spec.sequences) if inputs.varlen else (spec.sequences[0],), inputs.varlen,
                        effective_window(spec), str(device), spec.sta, spec.heads_q, inputs.prefix_len, spec.tree)
        fn = compiled_flex(self.compile_backend, self.mode) if self.compile else flex_attention
        kwargs = {"block_mask": bm, "scale": spec.softmax_scale, "enable_gqa": spec.gqa,
                  "score_mod": variant_score_mod(spec, device)}

        def pre(q, k, v):
            if inputs.prefix_k is not None:  # the keys as FlexAttention reads them: the prefix once, then the rest
                k, v = torch.cat([inputs.prefix_k, k]), torch.cat([inputs.prefix_v, v])
            if inputs.varlen:  # (T, H, D) -> (1, H, T, D)
                return tuple(t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
            return tuple(t.transpose(1, 2) for t in (q, k, v))

        def forward(q, k, v, sinks=None):
            if sinks is None:
                out = fn(q, k, v, **kwargs).transpose(1, 2)
                return out[0] if inputs.varlen else out
            out, lse = rescale_for_sinks(*flex_with_lse(fn, q, k, v, kwargs), sinks)
            out = out.transpose(1, 2)
            return (out[0], lse[0]) if inputs.varlen else (out, lse)

        with _unlimited_recompiles():
            start = time.perf_counter()
            closure = autograd_closure(spec, inputs, forward, pre)
            closure()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first_ms = (time.perf_counter() - start) * 1e3
        info = self.base_info() | {
            "kernel": f"flex_attention ({'torch.compile ' + self.compile_backend if self.compile else 'eager'})",
            "compile_ms" if self.compile else "first_call_ms": round(first_ms, 3),
            "mask": _mask_label(spec, bm), "gqa": "native" if spec.gqa else "none"}
        how = [how for on, how in ((spec.softcap is not None or spec.alibi is not None, "score_mod"),
                                   (spec.sinks, "sinks from the LSE"), (spec.gate, "gate after the call"))
               if on]
        if how:
            info["variants"] = " + ".join(how)
        return Prepared(fn=closure, info=info)


def flex_with_lse(fn, q, k, v, kwargs: dict):
    """(out, lse) of a FlexAttention call: ``return_aux`` where torch has it (2.9 on), ``return_lse`` before."""
    from torch.nn.attention import flex_attention as flex_module
    if hasattr(flex_module, "AuxRequest"):
        out, aux = fn(q, k, v, return_aux=flex_module.AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return fn(q, k, v, return_lse=True, **kwargs)


def rescale_for_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention sinks from a kernel's (B, H, S, D) output and natural-log (B, H, S) LSE: each row rescaled by
    ``sigmoid(lse − sink) = exp(lse − logaddexp(lse, sink))``; returns (out, LSE with the sink)."""
    total = torch.logaddexp(lse.float(), sinks.float().view(1, -1, 1))
    return (out * torch.exp(lse.float() - total).unsqueeze(-1)).to(out.dtype), total


def _mask_label(spec: AttnSpec, bm) -> str:
    if bm is None:
        return "none"
    if spec.sta is not None:
        return f"STA block mask {tuple(bm.shape[-2:])}, {bm.sparsity():.1f}% of blocks skipped"
    kind = "document" if spec.is_varlen else ("window" if spec.has_window else "causal")
    if spec.shared_prefix or spec.tree is not None:
        kind = " + ".join(k for k, on in (("prefix", spec.shared_prefix), ("document", True),
                                           ("tree", spec.tree is not None)) if on)
    return f"{kind} block mask {tuple(bm.shape[-2:])}"

"""Exact index-selected MLA (DeepSeek sparse attention), forward and backward, in blocks of queries.

**The operator.** T queries ``q`` (T, Hq, D) attend rows of a cache ``kv`` (N, D) shared by every query head (one
KV head; DeepSeek-V3.2: D = 576 = 512 latent + 64 rope). Query t attends only the rows its slots name,
``selection.indices[t]`` (K slots); the value of a row is its first ``d_v`` dims (512: the latent). For query t
and head h, over the valid slots j of t (the main cache's, then an optional extra cache's)::

    s_hj  = scale · q_th · row_j                       (natural-log units)
    lse   = log Σ_j exp(s_hj)                         (the sink is NOT in it: FlashMLA's lse)
    out   = Σ_j exp(s_hj − lse) · row_j[:d_v] · σ(lse − sink_h)
    max_logits = max_j s_hj

with σ(lse − sink) = exp(lse) / (exp(lse) + exp(sink)): the sink joins the softmax denominator and takes no value.
A query with no valid slot has ``out = 0`` (whatever its sink), ``lse = −inf`` and ``max_logits = −inf`` (the
project's convention for "no key": FlashMLA writes lse = +inf there; ``compare`` takes either).

**Slots, as FlashMLA defines them** (deepseek-ai/FlashMLA @9241ae3):

- A slot is empty when its index is < 0 or >= N (``flash_mla/flash_mla_interface.py:191``: "Invalid indices
  should be set to -1 or numbers >= s_kv"; ``csrc/sm90/prefill/sparse/phase1.cuh:485``: ``t >= 0 && t < s_kv``;
  their tests draw INT_MIN, -123456, s_kv, INT_MAX as invalid values, ``tests/lib.py:131``). The sparse FP8
  *decode* kernel only knows -1 (``csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:632``: ``index != -1``; any other
  out-of-range index is read as a page address), so decode callers must write -1.
- Only the first ``lengths[t]`` slots of query t count (``topk_length``; ``interface.py:198``, ``phase1.cuh:487``,
  ``tests/ref.py:28-30``). Prefill takes one length per query (s_q,); decode one per request (b,), shared by its
  s_q queries (``csrc/api/sparse_decode.h:307``) — ``flashmla.py`` expands it to this per-query form.
- A duplicate index is one more term of the softmax, once per slot: FlashMLA's reference gathers one row per
  slot (``tests/ref.py:35``, ``index_select`` over the flattened indices) and its kernels load each slot on its
  own. Their tests only draw distinct indices (``tests/lib.py:100-119``, a random permutation), so the kernels'
  behaviour on duplicates is the reference's by construction, not by a test of theirs.
- ``attn_sink`` (Hq,) float32 is a logit in the same natural-log units as the scaled scores: the kernels multiply
  it by log2(e) like the scores (``phase1.cuh:205``, ``splitkv_mla.cuh:203``) and the reference merges it with
  ``torch.logsumexp`` (``tests/ref.py:7-17,43``). It scales the output by exp(lse)/(exp(lse)+exp(sink)) and has
  no effect on the returned lse or max_logits (``interface.py:88,195-196``; decode writes lse before adding the
  sink, ``csrc/smxx/decode/combine/combine.cu:100-108``). −inf has no effect, +inf makes the output 0; a query
  with no valid slot gets 0 whatever the sink (``phase1.cuh:206-208``).
- The extra cache (V4, decode only: ``extra_k_cache``, ``extra_indices_in_kvcache``, ``extra_topk_length``) is a
  second cache with its own index lists and lengths whose slots join the *same* softmax
  (``tests/ref.py:76-90``: the two gathers concatenated before one logsumexp).
- lse and max_logits are natural-log: the kernels keep the running max in base 2 and convert on the way out
  (``phase1.cuh:448-449``: ``rM·ln2``, ``logf(rL) + rM·ln2``; ``splitkv_mla.cuh:340``), and their tests compare
  them to ``torch.logsumexp`` / ``max`` of the scaled scores (``tests/test_flash_mla_sparse_prefill.py:47-48``).
  max_logits is the largest scaled score over the valid slots (``tests/ref.py:41``); prefill returns it.

**Backward** (no FlashMLA kernel has one; training kernels will): with ``Z = lse ⊕ sink`` the full normaliser and
``P_hj = exp(s_hj − Z)``, ``δ = Σ_d dO·O``: ``dS = P ∘ (dO·V_jᵀ − δ)``, ``dq = scale · dS · rows``, the gradient
of slot j's row ``scale · dSᵀ q + [Pᵀ dO, 0]`` (the value part on the first d_v dims) scattered back to its cache
row — a row named by several slots (of one query or many) gets the sum — and ``d sink_h = −Σ_t σ(sink_h − lse)·δ``.

**Precision and memory** as ``accuracy/reference.py``: fp64 on the CPU, fp32 on a GPU for 16-bit inputs with TF32
off (``exact_fp32_matmul``). Queries go ``BlockSizes.q`` at a time, fewer when one block's gathered rows
(rows·slots·D) or scores (rows·Hq·slots) would pass ``BlockSizes.max_elems``; nothing of size T × N is built.

Shapes (``attnbench.outputs.Outputs``): ``out`` (T, Hq, d_v); ``lse``, ``max_logits`` (Hq, T) (the varlen layout
of ``accuracy/reference.py``); ``dq`` like q; ``dkv`` like kv ((N, D) or (N, 1, D)); ``dextra_kv`` like the
extra cache; ``dattn_sink`` (Hq,) — inputs named as FlashMLA names them (its per-head gradient, like the gpt-oss sink
feature's, has too few elements for the verdict's systematic measures). All in the compute dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.accuracy.reference import BlockSizes, compute_dtype_for, exact_fp32_matmul
from attnbench.outputs import Outputs

LATENT, ROPE = 512, 64
"""DeepSeek-V3.2's cached row: the latent (also the value) then the rope part, 576 in all."""


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The cache rows each query attends: K slots per query, each naming one row (or empty)."""

    indices: torch.Tensor
    """(T, K) integer row indices; a slot < 0 or >= the cache's row count is empty."""
    lengths: torch.Tensor | None = None
    """(T,) integers: only the first lengths[t] slots of query t count (FlashMLA's topk_length); None = all K."""

    def __post_init__(self) -> None:
        if self.indices.dim() != 2 or self.indices.dtype.is_floating_point:
            raise ValueError(f"indices must be (T, K) integers, got {tuple(self.indices.shape)} {self.indices.dtype}")
        if self.lengths is not None and tuple(self.lengths.shape) != (self.indices.shape[0],):
            raise ValueError(f"lengths must be ({self.indices.shape[0]},), got {tuple(self.lengths.shape)}")

    def valid(self, rows: int, a: int = 0, b: int | None = None) -> torch.Tensor:
        """(b-a, K) bool: which slots of queries [a, b) name one of ``rows`` cache rows and count."""
        idx = self.indices[a:b]
        ok = (idx >= 0) & (idx < rows)
        if self.lengths is not None:
            slot = torch.arange(idx.shape[1], device=idx.device)
            ok &= slot[None, :] < self.lengths[a:b, None].to(idx.device)
        return ok


@dataclass(frozen=True, kw_only=True)
class Cache:
    """One cache and its selection."""

    rows: torch.Tensor
    """(N, D) cache rows (a view of the (N, 1, D) cache a kernel takes)."""
    selection: Selection
    """The rows of it each query attends."""


def caches(q, kv, selection, extra_kv=None, extra=None) -> list[Cache]:
    """The main cache and the extra one (if any) with their selections, checked against q (T, Hq, D)."""
    if (extra_kv is None) != (extra is None):
        raise ValueError("an extra cache needs its selection, and a selection its cache")
    out = []
    for cache, sel in ((kv, selection), (extra_kv, extra)):
        if cache is None:
            continue
        if cache.dim() == 3:
            if cache.shape[1] != 1:
                raise ValueError(f"one KV head: the cache must be (N, D) or (N, 1, D), got {tuple(cache.shape)}")
            cache = cache[:, 0]
        if cache.dim() != 2 or cache.shape[1] != q.shape[-1] or cache.shape[0] < 1:
            raise ValueError(f"cache {tuple(cache.shape)} does not match queries {tuple(q.shape)}")
        if sel.indices.shape[0] != q.shape[0]:
            raise ValueError(f"{sel.indices.shape[0]} index lists for {q.shape[0]} queries")
        out.append(Cache(rows=cache, selection=sel))
    return out


def _row_block(queries: int, slots: int, heads: int, dim: int, blocks: BlockSizes) -> int:
    per_query = max(1, slots * max(dim, heads))
    return max(1, min(blocks.q, queries, blocks.max_elems // per_query))


def _setup(q, kv, selection, extra_kv, extra, dtype, blocks) -> tuple[torch.dtype, list[Cache], int]:
    """What the forward and the backward both start from: the compute dtype, the caches with their selections, and
    the queries per block."""
    dtype = dtype or compute_dtype_for(q.device, q.dtype)
    sources = caches(q, kv, selection, extra_kv, extra)
    tq, hq, dim = q.shape
    slots = sum(s.selection.indices.shape[1] for s in sources)
    return dtype, sources, _row_block(tq, slots, hq, dim, blocks or BlockSizes())


def _gather(sources: list[Cache], a: int, b: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the slots of queries [a, b), all sources side by side: (rows (b-a, K', D) in ``dtype``, zero in
    empty slots so that whatever an unused row holds (FlashMLA's tests fill them with NaN) never reaches a sum;
    valid (b-a, K') bool)."""
    rows, valid = [], []
    for src in sources:
        ok = src.selection.valid(src.rows.shape[0], a, b)
        idx = src.selection.indices[a:b].long().clamp(0, src.rows.shape[0] - 1)
        got = src.rows[idx].to(dtype)
        rows.append(torch.where(ok[..., None], got, torch.zeros((), dtype=dtype, device=got.device)))
        valid.append(ok)
    return torch.cat(rows, dim=1), torch.cat(valid, dim=1)


def _scores(q_blk: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """(rows, Hq, K') scaled scores, −inf in empty slots."""
    s = torch.bmm(q_blk, rows.transpose(1, 2)).mul_(scale)
    return s.masked_fill_(~valid[:, None, :], -math.inf)


def _sink_weight(lse: torch.Tensor, attn_sink: torch.Tensor | None) -> torch.Tensor:
    """σ(lse − sink): the share of a row's softmax its keys keep; 0 for a row with no key (lse = −inf)."""
    if attn_sink is None:
        return (~torch.isneginf(lse)).to(lse.dtype)
    w = torch.sigmoid(lse - attn_sink.to(lse.dtype))
    return torch.where(torch.isneginf(lse), torch.zeros_like(w), w)


def sparse_forward(q: torch.Tensor, kv: torch.Tensor, selection: Selection, *, scale: float, d_v: int = LATENT,
                   attn_sink: torch.Tensor | None = None, extra_kv: torch.Tensor | None = None,
                   extra: Selection | None = None, dtype: torch.dtype | None = None,
                   blocks: BlockSizes | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact (out (T, Hq, d_v), lse (Hq, T), max_logits (Hq, T)) in ``dtype`` (module docstring): q (T, Hq, D), kv
    (N, D) or (N, 1, D), ``attn_sink`` (Hq,) logits or None, ``extra_kv`` (N2, D) with its ``extra`` selection."""
    dtype, sources, bq = _setup(q, kv, selection, extra_kv, extra, dtype, blocks)
    tq, hq, _ = q.shape
    out = torch.zeros(tq, hq, d_v, dtype=dtype, device=q.device)
    lse = torch.full((tq, hq), -math.inf, dtype=dtype, device=q.device)
    top = torch.full_like(lse, -math.inf)
    with exact_fp32_matmul():
        for a in range(0, tq, bq):
            b = min(tq, a + bq)
            rows, valid = _gather(sources, a, b, dtype)
            s = _scores(q[a:b].to(dtype), rows, valid, scale)
            top[a:b] = s.amax(dim=-1)
            row_lse = torch.logsumexp(s, dim=-1)  # −inf for a row with no valid slot
            p = s.sub_(torch.where(torch.isinf(row_lse), 0.0, row_lse)[..., None]).exp_()
            o = torch.bmm(p, rows[..., :d_v])
            out[a:b] = o.mul_(_sink_weight(row_lse, attn_sink)[..., None])
            lse[a:b] = row_lse
            del s, p, rows
    return out, lse.T, top.T


def sparse_backward(q: torch.Tensor, kv: torch.Tensor, selection: Selection, out: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, *, scale: float, d_v: int = LATENT, attn_sink: torch.Tensor | None = None,
                    extra_kv: torch.Tensor | None = None, extra: Selection | None = None,
                    dtype: torch.dtype | None = None, blocks: BlockSizes | None = None) -> dict[str, torch.Tensor]:
    """Exact ``dq``, ``dkv`` (and ``dextra_kv``, ``dattn_sink`` when given) from the exact ``out`` (T, Hq, d_v) and
    ``lse`` (Hq, T) of ``sparse_forward`` and ``dout`` (T, Hq, d_v); arguments as there."""
    dtype, sources, bq = _setup(q, kv, selection, extra_kv, extra, dtype, blocks)
    tq, hq, dim = q.shape
    dq = torch.zeros(tq, hq, dim, dtype=dtype, device=q.device)
    drows = [torch.zeros(s.rows.shape, dtype=dtype, device=q.device) for s in sources]
    dattn_sink = None if attn_sink is None else torch.zeros(hq, dtype=dtype, device=q.device)
    lse_t = lse.T.to(dtype)
    with exact_fp32_matmul():
        for a in range(0, tq, bq):
            b = min(tq, a + bq)
            rows, valid = _gather(sources, a, b, dtype)
            q_blk = q[a:b].to(dtype)
            row_lse = lse_t[a:b]
            total = row_lse if attn_sink is None else torch.logaddexp(row_lse, attn_sink.to(dtype))
            total = torch.where(torch.isneginf(row_lse), math.inf, total)  # no key: P = 0 (the output is 0)
            p = _scores(q_blk, rows, valid, scale).sub_(total[..., None]).exp_()
            do_blk, o_blk = dout[a:b].to(dtype), out[a:b].to(dtype)
            delta = (do_blk * o_blk).sum(dim=-1)
            ds = torch.bmm(do_blk, rows[..., :d_v].transpose(1, 2)).sub_(delta[..., None]).mul_(p)
            dq[a:b] = torch.bmm(ds, rows).mul_(scale)
            drow = torch.bmm(ds.transpose(1, 2), q_blk).mul_(scale)
            drow[..., :d_v] += torch.bmm(p.transpose(1, 2), do_blk)
            _scatter(sources, drows, drow, valid, a, b)
            if dattn_sink is not None:
                dattn_sink -= (_sink_share(row_lse, attn_sink) * delta).sum(dim=0)
            del p, ds, drow, rows
    grads = {"dq": dq}
    for name, grad, given in zip(("dkv", "dextra_kv"), drows, (kv, extra_kv)):
        grads[name] = grad.view(given.shape)
    if dattn_sink is not None:
        grads["dattn_sink"] = dattn_sink
    return grads


def _sink_share(lse: torch.Tensor, attn_sink: torch.Tensor) -> torch.Tensor:
    """σ(sink − lse): the sink's share of each row's softmax; 0 for a row with no key (its output is 0)."""
    share = torch.sigmoid(attn_sink.to(lse.dtype) - lse)
    return torch.where(torch.isneginf(lse), torch.zeros_like(share), share)


def _scatter(sources: list[Cache], drows: list[torch.Tensor], drow: torch.Tensor, valid: torch.Tensor,
             a: int, b: int) -> None:
    """Add each valid slot's row gradient (b-a, K', D) to its cache row; duplicates add up."""
    start = 0
    for src, grad in zip(sources, drows):
        width = src.selection.indices.shape[1]
        ok = valid[:, start:start + width]
        idx = src.selection.indices[a:b].long()[ok]
        grad.index_add_(0, idx, drow[:, start:start + width][ok])
        start += width


def reference_sparse(q: torch.Tensor, kv: torch.Tensor, selection: Selection, *, scale: float, d_v: int = LATENT,
                     attn_sink: torch.Tensor | None = None, extra_kv: torch.Tensor | None = None,
                     extra: Selection | None = None, dout: torch.Tensor | None = None,
                     dtype: torch.dtype | None = None, blocks: BlockSizes | None = None) -> Outputs:
    """Exact outputs of one index-selected MLA call (shapes in the module docstring); with ``dout`` (T, Hq, d_v)
    also the gradients of q, the cache(s) and the sink logits."""
    kw = dict(scale=scale, d_v=d_v, attn_sink=attn_sink, extra_kv=extra_kv, extra=extra, dtype=dtype, blocks=blocks)
    out, lse, top = sparse_forward(q, kv, selection, **kw)
    ref = Outputs(out=out, lse=lse, max_logits=top)
    if dout is not None:
        for name, grad in sparse_backward(q, kv, selection, out, lse, dout, **kw).items():
            ref[name] = grad
    return ref

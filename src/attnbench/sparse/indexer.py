"""DeepSeek-V3.2's lightning indexer as its own operator: FP8 logits, the top-k per query, and the check of a
kernel's selection.

**Logits.** For query t and key s (DeepGEMM's ``fp8_mqa_logits``, ``README.md:93-110`` of deepseek-ai/DeepGEMM, and
its reference ``tests/test_attention.py:84-113``)::

    logit[t, s] = Σ_h  w[t, h] · relu(q[t, h] · k[s])      for ks[t] <= s < ke[t], else −inf

where ``q`` (T, Hi, Di) are e4m3 values, ``k[s] = k_fp8[s] · k_scale[s]`` (one float32 scale per key token, DeepGEMM's
``per_custom_dims_cast_to_fp8(kv, (0,), False)``) and ``w`` (T, Hi) float32 weights. No softmax scale appears: the
model folds it into the weights with q's own scales — DeepSeek-V3.2-Exp ``inference/model.py:467-473``: ``weights =
weights_proj(x) · Hi^-½ · q_scale · Di^-½``, q and k quantized per 128 values (one block: Di = 128) with UE8M0
scales (``config_671B_v3.2.json``: ``scale_fmt = "ue8m0"``); its kernel ``fp8_index`` (``inference/kernel.py:200-
270``) computes ``k_scale[s] · Σ_h relu(q_fp8 · k_fp8) · w``, the same number (the scale is positive). Only keys at
or before the query's own position count: ``[ks, ke)`` is DeepGEMM's ``cu_seq_len_k_start/end``; the causal
default is ``ks = 0``, ``ke = pos + 1`` with the queries the last T of S tokens (``pos = S − T + t``), as the paged
reference masks ``k <= q_offset`` (``test_attention.py:270``) and the model adds its causal mask, −inf above the
diagonal (``model.py:892``, ``triu_(1)``), before its top-k (``model.py:474-476``). V3.2: Hi = 64, Di = 128,
k = 2048 (``config_671B_v3.2.json``).

**Exact reference** (``indexer_logits``, ``indexer_topk``): the e4m3 inputs exactly, in fp64 on the CPU, fp32 with
TF32 off on a GPU, in blocks of queries (a block's (rows, Hi, S) products bounded by ``BlockSizes.max_elems``).
``indexer_topk`` keeps only each block's top k, never the whole (T, S) matrix; a query that sees fewer than k keys
gets −1 in its remaining slots. **Baseline** (``indexer_baseline``): DeepGEMM's reference math in PyTorch, the
logits in float32, then ``torch.topk``.

**The selection check** (``check_selection``). Kernels break ties and near-ties differently (bf16 logits tie often),
so chosen indices are not compared with the reference's. Per query, with ``r`` the reference's top-k scores sorted
and ``g`` the reference scores *at the kernel's chosen indices*, sorted, and ``tol = rel · max_s |logit[t, s]|``: a
selection is right when it names as many distinct visible keys as the reference, ``|g − r| <= tol`` position by
position, and no chosen key scores below ``r[k−1] − tol``. Chosen keys outside ``[ks, ke)`` (other than -1) and
repeated keys are errors of their own. ``compare_logits`` compares a kernel's logits with the reference where the
key is visible (the metrics of ``accuracy.compare``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.accuracy.compare import tensor_metrics
from attnbench.accuracy.reference import BlockSizes, compute_dtype_for, exact_fp32_matmul
from attnbench.sparse.fp8 import e4m3_blocks

INDEX_HEADS, INDEX_DIM, INDEX_TOPK = 64, 128, 2048
"""DeepSeek-V3.2's indexer: heads, head size, tokens kept per query."""


@dataclass(frozen=True, kw_only=True)
class IndexerInputs:
    """What an indexer kernel reads for T queries over S cached keys."""

    q: torch.Tensor
    """(T, Hi, Di) float8_e4m3fn queries (their scales are in ``weights``)."""
    k: torch.Tensor
    """(S, Di) float8_e4m3fn keys."""
    k_scale: torch.Tensor
    """(S,) float32: key s stands for ``k[s] · k_scale[s]``."""
    weights: torch.Tensor
    """(T, Hi) float32 per-head weights (the model's weights, q's scales and the softmax scale folded in)."""
    ks: torch.Tensor
    """(T,) int32: the first key query t may see."""
    ke: torch.Tensor
    """(T,) int32: one past the last key query t may see."""

    def visible(self, a: int = 0, b: int | None = None) -> torch.Tensor:
        """(b-a, S) bool: which keys queries [a, b) may see."""
        s = torch.arange(self.k.shape[0], device=self.k.device)
        return (s[None, :] >= self.ks[a:b, None]) & (s[None, :] < self.ke[a:b, None])


def causal_bounds(queries: int, keys: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ks, ke) of queries that are the last ``queries`` of ``keys`` tokens, each seeing itself and what precedes."""
    ke = torch.arange(keys - queries + 1, keys + 1, dtype=torch.int32, device=device)
    return torch.zeros_like(ke), ke


def draw_indexer_inputs(queries: int, keys: int, *, heads: int = INDEX_HEADS, dim: int = INDEX_DIM,
                        generator: torch.Generator, causal: bool = True, device=None) -> IndexerInputs:
    """Seeded inputs: bf16 N(0, 1) queries and keys quantized as the model does (q per (token, head) with UE8M0
    scales folded into the weights, k per token), weights N(0, 1) · Hi^-½ · Di^-½ · q's scale."""
    q = torch.randn(queries, heads, dim, generator=generator, device=device).bfloat16()
    k = torch.randn(keys, dim, generator=generator, device=device).bfloat16()
    w = torch.randn(queries, heads, generator=generator, device=device)
    q8, q_scale = e4m3_blocks(q, dim, pow2=True)
    k8, k_scale = e4m3_blocks(k, dim, pow2=False)
    weights = w * heads ** -0.5 * dim ** -0.5 * q_scale[..., 0]
    if causal:
        ks, ke = causal_bounds(queries, keys, device)
    else:
        ks = torch.zeros(queries, dtype=torch.int32, device=device)
        ke = torch.full_like(ks, keys)
    return IndexerInputs(q=q8, k=k8, k_scale=k_scale[:, 0], weights=weights, ks=ks, ke=ke)


def _rows(inputs: IndexerInputs, blocks: BlockSizes) -> int:
    per_query = max(1, inputs.q.shape[1] * inputs.k.shape[0])
    return max(1, min(blocks.q, inputs.q.shape[0], blocks.max_elems // per_query))


def _logits(inputs: IndexerInputs, a: int, b: int, k: torch.Tensor, dtype) -> torch.Tensor:
    """(b-a, S) logits of queries [a, b) in ``dtype`` against keys ``k`` (S, Di) already scaled, −inf where unseen."""
    q = inputs.q[a:b].to(dtype)
    prod = torch.matmul(q, k.T).relu_()  # (rows, Hi, S)
    out = torch.bmm(inputs.weights[a:b].to(dtype)[:, None, :], prod)[:, 0]
    return out.masked_fill_(~inputs.visible(a, b), -math.inf)


def _scaled_keys(inputs: IndexerInputs, dtype) -> torch.Tensor:
    return inputs.k.to(dtype) * inputs.k_scale.to(dtype)[:, None]


def indexer_logits(inputs: IndexerInputs, *, dtype: torch.dtype | None = None,
                   blocks: BlockSizes | None = None) -> torch.Tensor:
    """Exact (T, S) logits in ``dtype`` (fp64 on the CPU, fp32 on a GPU), −inf where a key is unseen."""
    dtype = dtype or compute_dtype_for(inputs.q.device)
    blocks = blocks or BlockSizes()
    k = _scaled_keys(inputs, dtype)
    out = torch.empty(inputs.q.shape[0], inputs.k.shape[0], dtype=dtype, device=inputs.q.device)
    rows = _rows(inputs, blocks)
    with exact_fp32_matmul():
        for a in range(0, out.shape[0], rows):
            b = min(out.shape[0], a + rows)
            out[a:b] = _logits(inputs, a, b, k, dtype)
    return out


def _top(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices (rows, topk) int32 with −1 where a query sees fewer keys, scores sorted, −inf there)."""
    width = min(topk, logits.shape[1])
    scores, idx = logits.topk(width, dim=-1)
    idx = torch.where(torch.isneginf(scores), -1, idx).to(torch.int32)
    if width < topk:
        idx = torch.nn.functional.pad(idx, (0, topk - width), value=-1)
        scores = torch.nn.functional.pad(scores, (0, topk - width), value=-math.inf)
    return idx, scores


def indexer_topk(inputs: IndexerInputs, topk: int = INDEX_TOPK, *, dtype: torch.dtype | None = None,
                 blocks: BlockSizes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (indices (T, topk) int32, their logits (T, topk) sorted descending): each query's ``topk``
    highest-scoring visible keys, −1 (score −inf) in the slots of a query that sees fewer."""
    dtype = dtype or compute_dtype_for(inputs.q.device)
    blocks = blocks or BlockSizes()
    k = _scaled_keys(inputs, dtype)
    t = inputs.q.shape[0]
    idx = torch.empty(t, topk, dtype=torch.int32, device=inputs.q.device)
    scores = torch.empty(t, topk, dtype=dtype, device=inputs.q.device)
    rows = _rows(inputs, blocks)
    with exact_fp32_matmul():
        for a in range(0, t, rows):
            b = min(t, a + rows)
            idx[a:b], scores[a:b] = _top(_logits(inputs, a, b, k, dtype), topk)
    return idx, scores


def indexer_baseline(inputs: IndexerInputs, topk: int = INDEX_TOPK) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch (DeepGEMM's reference math): (logits (T, S) float32, indices (T, topk) int32, −1 where
    unseen); it holds a (T, Hi, S) product at once, so it is for small cases."""
    q = inputs.q.float()
    k = inputs.k.float() * inputs.k_scale[:, None]
    prod = torch.einsum("thd,sd->ths", q, k).relu()
    logits = torch.einsum("ths,th->ts", prod, inputs.weights.float())
    logits = logits.masked_fill(~inputs.visible(), -math.inf)
    return logits, _top(logits, topk)[0]


@dataclass(frozen=True, kw_only=True)
class SelectionCheck:
    """What is wrong with a kernel's top-k selection, counted over all queries (module docstring)."""

    queries: int
    """Queries checked."""
    expected: int
    """Keys the reference selects (Σ min(k, visible keys))."""
    missing: int
    """Keys the kernel should have selected and did not: the reference's count minus the kernel's, summed."""
    unseen: int
    """Chosen indices other than −1 that the query may not see (masked or outside the cache)."""
    repeated: int
    """Chosen indices that repeat one chosen before in the same query."""
    below: int
    """Chosen keys whose reference score is below the reference's k-th score minus the tolerance."""
    mismatched: int
    """Positions of the sorted score vectors (chosen vs the reference's top k) further apart than the tolerance."""
    worst: float
    """Largest |chosen − reference| sorted-score difference in units of its query's tolerance (0 if none)."""

    @property
    def ok(self) -> bool:
        """The selection is right: nothing missing, unseen, repeated, below or mismatched."""
        return not (self.missing or self.unseen or self.repeated or self.below or self.mismatched)


def check_selection(chosen: torch.Tensor, inputs: IndexerInputs, topk: int = INDEX_TOPK, *, rel: float = 2 ** -8,
                    dtype: torch.dtype | None = None, blocks: BlockSizes | None = None) -> SelectionCheck:
    """Judge a kernel's chosen indices (T, topk) against the exact logits; ``rel`` is the tolerance in units of each
    query's largest |logit| (2^-8: one bfloat16 round-off, for kernels that rank bf16 logits)."""
    dtype = dtype or compute_dtype_for(inputs.q.device)
    blocks = blocks or BlockSizes()
    k = _scaled_keys(inputs, dtype)
    t = inputs.q.shape[0]
    totals = torch.zeros(6, dtype=torch.int64, device=inputs.q.device)
    worst = torch.zeros((), dtype=dtype, device=inputs.q.device)
    rows = _rows(inputs, blocks)
    with exact_fp32_matmul():
        for a in range(0, t, rows):
            b = min(t, a + rows)
            counts, gap = _judge(chosen[a:b].to(inputs.q.device).long(), _logits(inputs, a, b, k, dtype), topk, rel)
            totals += counts
            worst = torch.maximum(worst, gap)
    expected, missing, unseen, repeated, below, mismatched = totals.tolist()
    return SelectionCheck(queries=t, expected=expected, missing=missing, unseen=unseen, repeated=repeated,
                          below=below, mismatched=mismatched, worst=float(worst))


def _judge(chosen: torch.Tensor, logits: torch.Tensor, topk: int, rel: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (expected, missing, unseen, repeated, below, mismatched), worst gap) of one block of queries."""
    _, ref = _top(logits, topk)
    seen = torch.isfinite(logits)
    tol = rel * torch.where(seen, logits.abs(), 0.0).amax(dim=-1)  # (rows,)
    named = chosen >= 0
    inside = named & (chosen < logits.shape[1])
    got = torch.full(chosen.shape, -math.inf, dtype=logits.dtype, device=logits.device)
    got[inside] = logits.gather(1, chosen.clamp(0, logits.shape[1] - 1))[inside]
    unseen = named & ~torch.isfinite(got)
    first = _first_occurrence(chosen) | ~named
    got = torch.where(first, got, -math.inf)  # a repeated key counts once
    got = got.sort(dim=-1, descending=True).values
    want = torch.isfinite(ref).sum(dim=-1)
    have = torch.isfinite(got).sum(dim=-1)
    both = torch.isfinite(ref) & torch.isfinite(got)
    diff = torch.where(both, (got - ref).abs(), 0.0)
    kth = torch.where(want > 0, ref.gather(1, (want - 1).clamp(min=0)[:, None])[:, 0], -math.inf)
    below = torch.isfinite(got) & (got < (kth - tol)[:, None])
    counts = torch.stack((want.sum(), (want - have).clamp(min=0).sum(), unseen.sum(), (named & ~first).sum(),
                          below.sum(), (diff > tol[:, None]).sum()))
    gap = (diff / torch.clamp_min(tol, torch.finfo(logits.dtype).tiny)[:, None]).amax() if diff.numel() else diff.sum()
    return counts, gap


def _first_occurrence(idx: torch.Tensor) -> torch.Tensor:
    """(rows, K) bool: the slot is the first in its row to hold its value."""
    order = idx.argsort(dim=-1, stable=True)
    s = idx.gather(1, order)
    first_sorted = torch.ones_like(s, dtype=torch.bool)
    first_sorted[:, 1:] = s[:, 1:] != s[:, :-1]
    return torch.empty_like(first_sorted).scatter_(1, order, first_sorted)


def compare_logits(logits: torch.Tensor, inputs: IndexerInputs, *, dtype: torch.dtype | None = None,
                   blocks: BlockSizes | None = None) -> dict:
    """``accuracy.compare`` metrics of a kernel's (T, S) logits against the exact ones, where the key is visible
    (what a kernel writes elsewhere — −inf, or nothing without DeepGEMM's ``clean_logits`` — is left out)."""
    ref = indexer_logits(inputs, dtype=dtype, blocks=blocks)
    got = logits.to(ref.device).masked_fill(~inputs.visible(), -math.inf)
    return tensor_metrics(got, ref)

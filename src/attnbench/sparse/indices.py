"""Index lists and seeded inputs of one index-selected MLA case.

Queries are the last ``s_q`` tokens of an ``s_kv``-token cache (lower-right aligned, like the project's causal
cases): query t sits at position ``pos = s_kv − s_q + t`` and, causal, may attend keys ``0..pos``. Every generator
returns (s_q, topk) int32 row indices, each query's keys first and −1 in the slots it cannot fill (a query that
sees fewer than ``topk`` keys), the form FlashMLA and DeepSeek's indexer produce:

- ``random_indices``: distinct visible keys drawn at random, in random order;
- ``prefix_indices``: the first visible keys (0, 1, ...): the attention-sink-like head of the sequence;
- ``window_indices``: the ``topk`` keys ending at the query's own position: a sliding window;
- ``indexer_indices``: the top-k of the lightning indexer (``indexer.py``) over seeded indexer inputs: the keys a
  model's indexer would keep.

``make_case`` draws a whole case from a seed: q and the cache in bf16, the selection, and optionally sink logits, an
extra cache (V4) with its own selection, per-query lengths, empty slots and repeated indices, so that each
semantic of ``reference.py`` can be made to matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.sparse.indexer import INDEX_DIM, INDEX_HEADS, draw_indexer_inputs, indexer_topk
from attnbench.sparse.reference import LATENT, ROPE, Selection

PATTERNS = ("random", "prefix", "window", "indexer")
DEEPSEEK_SCALE = 192 ** -0.5
"""DeepSeek-V3's softmax scale (its 128 nope + 64 rope query head size), not 576^-½."""


def positions(s_q: int, s_kv: int, device=None) -> torch.Tensor:
    """(s_q,) int64 positions of the queries: the last s_q of s_kv tokens."""
    if not 0 < s_q <= s_kv:
        raise ValueError(f"need 0 < s_q <= s_kv, got s_q={s_q}, s_kv={s_kv}")
    return torch.arange(s_kv - s_q, s_kv, device=device)


def visible_keys(s_q: int, s_kv: int, causal: bool = True, device=None) -> torch.Tensor:
    """(s_q,) int64: how many keys each query may attend (pos + 1 causal, else s_kv)."""
    pos = positions(s_q, s_kv, device)
    return pos + 1 if causal else torch.full_like(pos, s_kv)


def _fill(keys: torch.Tensor, count: torch.Tensor, topk: int) -> torch.Tensor:
    """(s_q, topk) int32: the first count[t] of keys[t] (s_q, >= topk), then −1."""
    slot = torch.arange(topk, device=keys.device)
    return torch.where(slot[None, :] < count[:, None], keys[:, :topk], -1).to(torch.int32)


def random_indices(s_q: int, s_kv: int, topk: int, *, generator: torch.Generator, causal: bool = True,
                   device=None) -> torch.Tensor:
    """min(topk, visible) distinct visible keys per query, drawn at random, in random order; −1 after."""
    seen = visible_keys(s_q, s_kv, causal, device)
    key = torch.arange(s_kv, device=device)
    noise = torch.rand(s_q, s_kv, generator=generator, device=device)
    noise = noise.masked_fill(key[None, :] >= seen[:, None], math.inf)  # unseen keys sort last
    order = noise.argsort(dim=-1)
    if s_kv < topk:
        order = torch.nn.functional.pad(order, (0, topk - s_kv), value=-1)
    return _fill(order, seen.clamp(max=topk), topk)


def prefix_indices(s_q: int, s_kv: int, topk: int, *, causal: bool = True, device=None) -> torch.Tensor:
    """Keys 0, 1, ... up to min(topk, visible) per query; −1 after."""
    seen = visible_keys(s_q, s_kv, causal, device)
    keys = torch.arange(topk, device=device).expand(s_q, topk)
    return _fill(keys, seen.clamp(max=topk), topk)


def window_indices(s_q: int, s_kv: int, topk: int, *, device=None) -> torch.Tensor:
    """The min(topk, pos + 1) keys ending at each query's own position, newest first; −1 after."""
    pos = positions(s_q, s_kv, device)
    keys = pos[:, None] - torch.arange(topk, device=device)[None, :]
    return _fill(keys, (pos + 1).clamp(max=topk), topk)


def indexer_indices(s_q: int, s_kv: int, topk: int, *, generator: torch.Generator, causal: bool = True,
                    heads: int = INDEX_HEADS, dim: int = INDEX_DIM, device=None) -> torch.Tensor:
    """The exact top-k of the indexer over seeded inputs (``indexer.draw_indexer_inputs``), highest first."""
    inputs = draw_indexer_inputs(s_q, s_kv, heads=heads, dim=dim, generator=generator, causal=causal, device=device)
    return indexer_topk(inputs, topk)[0]


def make_indices(pattern: str, s_q: int, s_kv: int, topk: int, *, generator: torch.Generator,
                 causal: bool = True, device=None) -> torch.Tensor:
    """(s_q, topk) int32 index lists of one of ``PATTERNS``."""
    if pattern == "random":
        return random_indices(s_q, s_kv, topk, generator=generator, causal=causal, device=device)
    if pattern == "prefix":
        return prefix_indices(s_q, s_kv, topk, causal=causal, device=device)
    if pattern == "window":
        return window_indices(s_q, s_kv, topk, device=device)
    if pattern == "indexer":
        return indexer_indices(s_q, s_kv, topk, generator=generator, causal=causal, device=device)
    raise ValueError(f"unknown index pattern {pattern!r}; allowed: {', '.join(PATTERNS)}")


@dataclass(frozen=True, kw_only=True)
class SparseCase:
    """The inputs of one index-selected MLA call (shapes as ``reference.reference_sparse`` takes them)."""

    q: torch.Tensor
    """(T, Hq, D) queries."""
    kv: torch.Tensor
    """(N, D) cache rows (one KV head)."""
    selection: Selection
    """The rows each query attends."""
    scale: float
    """Softmax scale of the scores."""
    d_v: int
    """Value width: the first d_v dims of a row."""
    attn_sink: torch.Tensor | None = None
    """(Hq,) float32 sink logits, or None."""
    extra_kv: torch.Tensor | None = None
    """(N2, D) rows of the extra cache, or None."""
    extra: Selection | None = None
    """The extra cache's selection, or None."""
    dout: torch.Tensor | None = None
    """(T, Hq, d_v) gradient of the output."""

    def kwargs(self) -> dict:
        """Keyword arguments of ``reference_sparse`` (and the baseline) besides q, kv and the selection."""
        return dict(scale=self.scale, d_v=self.d_v, attn_sink=self.attn_sink, extra_kv=self.extra_kv, extra=self.extra,
                    dout=self.dout)


def make_case(s_q: int, s_kv: int, heads: int, topk: int, *, pattern: str = "random", dim: int = LATENT + ROPE,
              d_v: int = LATENT, scale: float = DEEPSEEK_SCALE, causal: bool = True, seed: int = 0,
              attn_sink: bool = False, lengths: bool = False, empty: float = 0.0, repeats: float = 0.0,
              extra: tuple[int, int] | None = None, dtype: torch.dtype = torch.bfloat16, device=None) -> SparseCase:
    """A seeded case. ``lengths``: each query's length drawn from 0..topk; ``empty``: the fraction of slots set to
    −1 or to an index past the cache (half each); ``repeats``: the fraction of slots overwritten with another slot's
    index of the same query; ``extra``: (rows, topk) of an extra cache with random indices and lengths of its own.
    Sinks are ln(mean valid slots) + σ²/2 + N(0, 1), σ² = scale²·D the scores' variance: with them each sink takes
    a large share of its rows, as the project's gpt-oss sink feature draws them."""
    gen = torch.Generator(device=device or "cpu").manual_seed(seed)
    q = torch.randn(s_q, heads, dim, generator=gen, device=device).to(dtype)
    kv = torch.randn(s_kv, dim, generator=gen, device=device).to(dtype)
    idx = make_indices(pattern, s_q, s_kv, topk, generator=gen, causal=causal, device=device)
    sel = _mutate(idx, s_kv, gen, lengths=lengths, empty=empty, repeats=repeats)
    extra_kv = extra_sel = None
    if extra is not None:
        rows, width = extra
        extra_kv = torch.randn(rows, dim, generator=gen, device=device).to(dtype)
        extra_idx = torch.randint(0, rows, (s_q, width), generator=gen, device=device, dtype=torch.int32)
        extra_sel = _mutate(extra_idx, rows, gen, lengths=True, empty=empty, repeats=0.0)
    sink = None
    if attn_sink:
        valid = sel.valid(s_kv).sum() + (0 if extra_sel is None else extra_sel.valid(extra_kv.shape[0]).sum())
        mean = max(1.0, float(valid) / s_q)
        sink = torch.randn(heads, generator=gen, device=device) + (math.log(mean) + scale ** 2 * dim / 2)
    dout = torch.randn(s_q, heads, d_v, generator=gen, device=device).to(dtype)
    return SparseCase(q=q, kv=kv, selection=sel, scale=scale, d_v=d_v, attn_sink=sink, extra_kv=extra_kv,
                      extra=extra_sel, dout=dout)


def _mutate(idx: torch.Tensor, rows: int, gen: torch.Generator, *, lengths: bool, empty: float,
            repeats: float) -> Selection:
    """``idx`` with some slots emptied or repeated, and random lengths (``make_case``)."""
    idx = idx.clone()
    t, k = idx.shape
    if repeats:
        hit = torch.rand(t, k, generator=gen, device=idx.device) < repeats
        src = torch.randint(0, k, (t, k), generator=gen, device=idx.device)
        idx = torch.where(hit, idx.gather(1, src), idx)
    if empty:
        hit = torch.rand(t, k, generator=gen, device=idx.device) < empty
        past = torch.rand(t, k, generator=gen, device=idx.device) < 0.5
        idx = torch.where(hit, torch.where(past, rows + 3, -1), idx).to(torch.int32)
    n = None
    if lengths:
        n = torch.randint(0, k + 1, (t,), generator=gen, device=idx.device, dtype=torch.int32)
    return Selection(indices=idx, lengths=n)

"""Packed documents: one long sequence that holds many documents, each attending only within itself (causally
when the case is causal): the batches long-context training packs, and what MagiAttention and torch's context
parallelism are judged on.

A case's documents are the sequences of a grouped spec laid end to end (``dist --seq-lens 3000,1000,4192`` or
``dist --seq-lens 128k --documents 8k``: seeded long-tailed lengths, ``long_tailed``). Every method sees the
packed sequence as one dense ``(1, total, H, D)`` tensor, sharded as usual. A block a rank computes (its
queries against one K/V shard) holds global rows given as runs (``Ranges``); it is split by document (one
slice of rows per document and side, a view), and the local kernel runs once per document present on both
sides: with the diagonal causal mask on a causal diagonal block (the query and key rows of a document are then the same rows), in full otherwise (every key of an
off-diagonal block precedes every query, or the case is not causal). Rows of a block that meet no key of
their document get ``lse = -inf``, which the ring's merge ignores; a block without a shared document is
skipped. The local kernels take no document mask, so this costs one kernel launch per document and block: many
short documents are launch-bound (a varlen kernel would do them in one call).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math

import numpy as np
import torch

from attnbench.distributed.kernels import LocalKernel
from attnbench.distributed.reference import exact_attention

Ranges = tuple[tuple[int, int], ...]
"""Global [start, end) runs of a block's rows, in the order the rows are stored."""
METHODS = ("ring", "zigzag", "ulysses", "ulysses-ce", "torch-cp-flex")
"""The methods that take packed documents (torch-cp-flex through its own block mask: ``torch_cp_flex.py``)."""
MAX_DOCUMENTS = 4096
"""Most documents a case may pack: each is one local-kernel call per block."""
SIGMA = 1.0
"""Log-normal shape of ``long_tailed``: the longest of a hundred documents is about ten times the median."""


def long_tailed(total: int, mean: int, seed: int = 0) -> tuple[int, ...]:
    """Document lengths summing to ``total``, drawn from a log-normal of mean ``mean`` (sigma ``SIGMA``), seeded;
    the last document is cut to fit."""
    if not 1 <= mean <= total:
        raise ValueError(f"a mean document length must be in 1..{total} (the tokens of the batch), got {mean}")
    rng = np.random.default_rng(seed)
    mu = math.log(mean) - SIGMA ** 2 / 2
    lengths, left = [], total
    while left:
        n = min(left, max(1, int(round(rng.lognormal(mu, SIGMA)))))
        lengths.append(n)
        left -= n
    return tuple(lengths)


@dataclasses.dataclass(frozen=True)
class Documents:
    """Document lengths, end to end."""

    lengths: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @functools.cached_property
    def bounds(self) -> list[tuple[int, int]]:  # every block of every timed call reads it: computed once
        ends = np.cumsum(self.lengths).tolist()
        return list(zip([0, *ends[:-1]], ends))

    def pieces(self, q_ranges: Ranges, k_ranges: Ranges) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Per document present on both sides: its local (lo, hi) rows among the queries and among the keys."""
        out = []
        for i in sorted(self._overlapping(q_ranges) & self._overlapping(k_ranges)):
            start, end = self.bounds[i]
            q, k = _local(q_ranges, start, end), _local(k_ranges, start, end)
            if q and k:
                out.append((q, k))
        return out

    @functools.cached_property
    def _ends(self) -> list[int]:
        return [end for _, end in self.bounds]

    def _overlapping(self, ranges: Ranges) -> set[int]:
        """Indices of the documents that share rows with ``ranges`` (found by bisection: a block holds few)."""
        ends = self._ends
        found = set()
        for a, b in ranges:  # document i spans [ends[i-1], ends[i]): it overlaps [a, b) when ends[i] > a, ends[i-1] < b
            found.update(range(bisect.bisect_right(ends, a), min(len(ends), bisect.bisect_left(ends, b) + 1)))
        return found


def front(ranges: Ranges, n: int) -> Ranges:
    """The runs of the first ``n`` stored rows."""
    out = []
    for a, b in ranges:
        if n <= 0:
            break
        out.append((a, min(b, a + n)))
        n -= b - a
    return tuple(out)


def back(ranges: Ranges, n: int) -> Ranges:
    """The runs of the last ``n`` stored rows."""
    out = []
    for a, b in reversed(ranges):
        if n <= 0:
            break
        out.append((max(a, b - n), b))
        n -= b - a
    return tuple(reversed(out))


def _local(ranges: Ranges, start: int, end: int) -> tuple[int, int] | None:
    """The local rows (lo, hi) of the global rows [start, end) within ``ranges``, None if none. They are one
    run: the ranges are sorted, so a document that reaches into a later range covers the end of the earlier
    one and the start of the later one, which lie next to each other in storage."""
    lo = hi = None
    offset = 0
    for a, b in ranges:
        first, last = max(a, start), min(b, end)
        if first < last:
            if lo is None:
                lo = offset + first - a
            elif hi != offset + first - a:
                raise ValueError(f"rows {start}..{end} are not one run of {ranges}")
            hi = offset + last - a
        offset += b - a
    return None if lo is None else (lo, hi)


def fwd(kernel: LocalKernel, docs: Documents, q, k, v, causal, scale, q_ranges: Ranges, k_ranges: Ranges):
    """(out, lse) of one block under the document mask, or None when the block shares no document."""
    pieces = docs.pieces(q_ranges, k_ranges)
    if not pieces:
        return None
    b, s, h, _ = q.shape
    out = q.new_zeros(b, s, h, v.shape[-1])
    lse = torch.full((b, h, s), float("-inf"), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                     device=q.device)
    for (qa, qb), (ka, kb) in pieces:
        out[:, qa:qb], lse[:, :, qa:qb] = kernel.fwd(q[:, qa:qb], k[:, ka:kb], v[:, ka:kb], causal, scale)
    return out, lse


def bwd(kernel: LocalKernel, docs: Documents, dout, q, k, v, out, lse, causal, scale, q_ranges: Ranges,
        k_ranges: Ranges):
    """(dq, dk, dv) of one block under the document mask, or None when the block shares no document."""
    pieces = docs.pieces(q_ranges, k_ranges)
    if not pieces:
        return None
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (qa, qb), (ka, kb) in pieces:
        dq[:, qa:qb], dk[:, ka:kb], dv[:, ka:kb] = kernel.bwd(
            dout[:, qa:qb], q[:, qa:qb], k[:, ka:kb], v[:, ka:kb], out[:, qa:qb], lse[:, :, qa:qb].contiguous(),
            causal, scale)
    return dq, dk, dv


def whole(kernel: LocalKernel, docs: Documents) -> LocalKernel:
    """``kernel`` on the whole packed sequence under the document mask (Ulysses' local call, one device)."""
    rows = ((0, docs.total),)

    def f(q, k, v, causal, scale):
        return fwd(kernel, docs, q, k, v, causal, scale, rows, rows)

    def b(dout, q, k, v, out, lse, causal, scale):
        return bwd(kernel, docs, dout, q, k, v, out, lse, causal, scale, rows, rows)

    return dataclasses.replace(kernel, fwd=f, bwd=b, description=f"{kernel.description}, per document")


def exact(q, k, v, dout, docs: Documents, *, causal: bool, scale: float) -> dict:
    """The exact out, dq, dk, dv of the packed sequence: each document on its own (``exact_attention``)."""
    parts = [exact_attention(*(t[:, a:b] for t in (q, k, v, dout)), causal=causal, scale=scale)
             for a, b in docs.bounds]
    return {name: torch.cat([p[name] for p in parts], dim=1) for name in parts[0]}

"""FLOPs and bytes of attention: the one place where attnbench's convention is written down.

Forward FLOPs = 2 * (d_qk + d_v) * H_q * P, where P is the exact number of (query, key) pairs that
are attended, summed over sequences: causal masks (lower-right aligned) and sliding windows are
counted exactly, varlen sums each sequence on its own. The two matmuls QK^T and PV each cost 2*d per
pair; softmax is not counted. Backward = 2.5x forward (five matmuls of the same size: recompute S,
dV, dP, dQ, dK), forward+backward = 3.5x forward.

A sliding tile mask (``spec.sta``) is counted exactly too, per query head (each head has its own window):
``flops`` uses the sum over heads instead of H_q x P.

The ``dense`` convention counts every pair (P = sq * sk, no causal discount), as many papers do.

The features of today's models (``attnbench.features``) add no FLOPs: their terms are elementwise work on the
scores or the output, like the softmax's exponential, which no convention counts. So a kernel's TF/s with and
without a feature count the same matmuls, and the feature's cost shows as a lower rate. A sliding window
counts exactly as ever (the pairs it keeps).

Bytes are the minimal traffic to device memory: forward reads Q, K, V (K/V at H_kv heads) and writes
O and the fp32 log-sum-exp; backward reads Q, K, V, O, dO and LSE and writes dQ, dK, dV. Each tensor
counts at its own element size: with fp8 inputs Q, K and V are one byte an element and O (bf16) two.
A feature's inputs are read once and, in the backward, their gradients written once (``Feature.input_bytes``:
a per-head fp32 logit is 4 bytes a head; a per-token input is the output's size).

Serving batches: a shared prefix is read once (the minimal traffic; a kernel that reads it once per request
moves more, and shows a lower rate), and an fp8 KV cache counts one byte an element (its descales are a few
bytes); a speculative tree counts the pairs it keeps (each new token's cached keys and its ancestors), not the
causal triangle. ``kv_bytes`` is the KV cache read alone, the figure a decode-dominated batch is judged by.

MLA with absorbed weights (``spec.mla``): FLOPs as above with d_qk = 576 and d_v = 512 (FlashMLA's benchmark counts
the same: ``s_q · Σ s_k · h_q · (d + d_v) · 2``); bytes read the latent cache once, one 576-wide row per token for all
query heads (the value is part of that row), as FlashMLA's benchmark counts them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from attnbench import features
from attnbench.serving import tree_keep
from attnbench.spec import AttnSpec

PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
CONVENTIONS = ("exact", "dense")
LSE_BYTES = 4


def attended_pairs(sq: int, sk: int, causal: bool, window: tuple[int, int] | None = None) -> int:
    """Exact number of (query, key) pairs attended in one sequence (lower-right aligned masks)."""
    rows = np.arange(sq, dtype=np.int64)
    diag = rows + (sk - sq)  # key index aligned with query i
    lo = np.zeros(sq, dtype=np.int64)
    hi = np.full(sq, sk - 1, dtype=np.int64)
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        lo = np.maximum(lo, diag - left)
    if right >= 0:
        hi = np.minimum(hi, diag + right)
    return int(np.clip(hi - lo + 1, 0, None).sum())


def pairs(spec: AttnSpec, convention: str = "exact") -> int:
    """(query, key) pairs attended per head, summed over all sequences of the spec."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOP convention {convention!r}; allowed: {', '.join(CONVENTIONS)}")
    if convention == "dense":
        return sum(sq * sk for sq, sk in spec.sequences)
    if spec.tree is not None:  # every cached key, and each new token's ancestors (itself included)
        ancestors = int(tree_keep(spec.tree).sum())
        return sum((sk - sq) * sq + ancestors for sq, sk in spec.sequences)
    if spec.sta is not None:  # heads differ: the mean over heads (flops() sums them exactly)
        return sum(spec.sta.pairs_per_head(spec.heads_q)) * spec.batch // spec.heads_q
    per_group = sum(attended_pairs(sq, sk, spec.causal, spec.window)
                    for sq, sk in zip(spec.seqlens_q, spec.seqlens_k, strict=True))
    return per_group * spec.batch


def flops(spec: AttnSpec, pass_: str | None = None, convention: str = "exact") -> float:
    """Floating-point operations of one call of ``pass_`` (default: the spec's pass)."""
    pass_ = pass_ or spec.pass_
    if spec.sta is not None and convention == "exact":
        head_pairs = sum(spec.sta.pairs_per_head(spec.heads_q)) * spec.batch
    else:
        head_pairs = spec.heads_q * pairs(spec, convention)
    fwd = 2.0 * (spec.head_dim + spec.head_dim_v) * head_pairs
    return fwd * PASS_FLOP_FACTOR[pass_]


def bytes_moved(spec: AttnSpec, pass_: str | None = None) -> float:
    """Minimal bytes read and written by one call of ``pass_`` (see module doc)."""
    pass_ = pass_ or spec.pass_
    elem, out_elem, kv_elem = spec.torch_dtype.itemsize, spec.out_dtype.itemsize, spec.kv_torch_dtype.itemsize
    tq = sum(sq for sq, _ in spec.sequences)
    tk = kv_tokens(spec)
    q = tq * spec.heads_q * spec.head_dim * elem
    k = tk * spec.heads_kv * spec.head_dim * kv_elem
    v = 0 if spec.mla else tk * spec.heads_kv * spec.head_dim_v * kv_elem  # MLA: the value is part of the key row
    o = tq * spec.heads_q * spec.head_dim_v * out_elem
    lse = tq * spec.heads_q * LSE_BYTES
    extra = sum(f.input_bytes(spec, tq, LSE_BYTES) for f in features.active(spec))
    fwd = q + k + v + o + lse + extra
    bwd = (q + k + v + o + o + lse + extra) + (q + k + v + extra)  # read q,k,v,o,do,lse; write dq,dk,dv
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[pass_]


def kv_tokens(spec: AttnSpec) -> int:
    """Distinct key/value tokens of a case: every sequence's keys, a shared prefix counted once."""
    tk = sum(sk for _, sk in spec.sequences)
    return tk - (len(spec.sequences) - 1) * spec.shared_prefix


def kv_bytes(spec: AttnSpec) -> int:
    """Bytes of the distinct keys and values a forward reads (a serving step's KV cache read)."""
    dims = spec.head_dim if spec.mla else spec.head_dim + spec.head_dim_v
    return kv_tokens(spec) * spec.heads_kv * dims * spec.kv_torch_dtype.itemsize


def tflops_per_s(flop: float, ms: float | None) -> float | None:
    """TFLOP/s for ``flop`` operations in ``ms`` milliseconds."""
    return None if not ms else flop / (ms * 1e-3) / 1e12


@dataclass(frozen=True)
class RateUnit:
    """The unit FLOP rates are shown in, for every view of them alike (``rate_unit``)."""

    short: str
    """In a table's narrow column or header: TF/s or GF/s."""
    name: str
    """In words (a figure's axis, the report, e2e): TFLOP/s or GFLOP/s."""
    factor: float
    """From TFLOP/s, the unit rates are stored in."""


TERA, GIGA = RateUnit("TF/s", "TFLOP/s", 1.0), RateUnit("GF/s", "GFLOP/s", 1e3)


def rate_unit(tflops: Iterable[float | None]) -> RateUnit:
    """The unit of the rates a view shows (in TFLOP/s, as stored): GFLOP/s when every one is under 1 TFLOP/s (a
    CPU run's 0.001-0.06), so that they read 1-60 with three significant digits and two kernels 60% apart never
    both read 0.02; TFLOP/s otherwise (and when there are none). The summary, the records table, the figures,
    the report, e2e and dist all ask this, so a run's rates have one unit wherever they are read."""
    rates = [r for r in tflops if r is not None and math.isfinite(r)]
    return GIGA if rates and max(rates) < 1.0 else TERA


def gb_per_s(nbytes: float, ms: float | None) -> float | None:
    """GB/s (10^9 bytes per second) for ``nbytes`` bytes in ``ms`` milliseconds."""
    return None if not ms else nbytes / (ms * 1e-3) / 1e9


def percent_of_peak(value: float | None, peak: float | None) -> float | None:
    """``value`` as a percentage of ``peak`` (same unit), None when either is unknown."""
    return None if not value or not peak else 100.0 * value / peak

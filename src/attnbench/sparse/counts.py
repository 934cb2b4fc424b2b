"""FLOPs and bytes of index-selected MLA: the work of the selected tokens, and the dense attention beside it.

**FLOPs** follow ``metrics.py``: each attended (query, key) pair costs ``2 · (D + d_v)`` per query head (QKᵀ and PV;
softmax not counted), backward 2.5x forward, forward+backward 3.5x. Here the pairs are the *valid slots*: slots
that name a cache row and lie within the query's length, main and extra cache together, a duplicate counted once
per slot (the kernel computes it once per slot)::

    forward FLOPs = 2 · Hq · Σ_t valid slots(t) · (D + d_v)          D = 576, d_v = 512 for DeepSeek-V3.2

FlashMLA's prefill benchmark (``tests/lib.py:345-357``) counts every slot within ``topk_length`` (or all topk),
empty ones too — its kernels do compute them; this counts what the operator attends, so a selection with empty
slots shows a lower rate, as a masked dense kernel does under the exact convention. The **dense equivalent** is
the attention over every key each query may see (lower-right causal, ``metrics.attended_pairs``): the work the
selection saves.

**Bytes** are the minimal traffic, as ``metrics.py``: forward reads q, each *distinct* selected row once (``row_bytes``:
1152 for a bf16 row of 576, 656 for V3.2's FP8 row), the index lists (int32), the lengths, the sink logits, and writes the
output and the fp32 lse. FlashMLA's prefill benchmark counts a row once per valid slot (its reads through L2); its
decode benchmark counts distinct rows (``tests/lib.py:378-398``), as here. The dense equivalent reads every visible
key row once. Backward reads q, rows, index lists, sink logits, out, dO, lse and writes dq, the gradient of each distinct row
(``elem_bytes`` an element) and the sink logits'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.metrics import LSE_BYTES, PASS_FLOP_FACTOR, attended_pairs
from attnbench.sparse.reference import LATENT, ROPE, Selection

INDEX_BYTES = 4
"""One int32 slot index (or length)."""


@dataclass(frozen=True, kw_only=True)
class SparseCounts:
    """The work of one call, selected and dense."""

    slots: int
    """Valid slots: (query, row) pairs attended per head, over all queries and both caches."""
    rows: int
    """Distinct cache rows read (each cache counted on its own)."""
    flops: float
    """FLOPs of the selected pairs for the pass."""
    bytes: float
    """Minimal bytes moved for the pass."""
    dense_pairs: int
    """(query, key) pairs of the dense equivalent (every visible key)."""
    dense_flops: float
    """FLOPs of the dense equivalent for the pass."""
    dense_bytes: float
    """Minimal bytes of the dense equivalent for the pass."""


def _selected(selection: Selection, rows: int) -> tuple[int, int]:
    """(valid slots, distinct valid rows) of one cache."""
    valid = selection.valid(rows)
    idx = selection.indices[valid]
    return int(valid.sum()), int(torch.unique(idx).numel())


def sparse_counts(selection: Selection, cache_rows: int, *, heads: int, d_qk: int = LATENT + ROPE,
                  d_v: int = LATENT, pass_: str = "fwd", row_bytes: int | None = None, elem_bytes: int = 2,
                  extra: Selection | None = None, extra_rows: int = 0, attn_sink: bool = False,
                  causal: bool = True) -> SparseCounts:
    """Counts of one call (module docstring): T queries, the last T of a ``cache_rows``-token sequence for the dense
    equivalent; q, out and gradients ``elem_bytes`` an element; a row ``row_bytes`` (default d_qk · elem_bytes)."""
    if pass_ not in PASS_FLOP_FACTOR:
        raise ValueError(f"unknown pass {pass_!r}; allowed: {', '.join(PASS_FLOP_FACTOR)}")
    row_bytes = row_bytes if row_bytes is not None else d_qk * elem_bytes
    t = selection.indices.shape[0]
    slots, rows = _selected(selection, cache_rows)
    index_bytes = selection.indices.numel() * INDEX_BYTES + (0 if selection.lengths is None else t * INDEX_BYTES)
    if extra is not None:
        more, more_rows = _selected(extra, extra_rows)
        slots, rows = slots + more, rows + more_rows
        index_bytes += extra.indices.numel() * INDEX_BYTES + (0 if extra.lengths is None else t * INDEX_BYTES)
    factor = PASS_FLOP_FACTOR[pass_]
    per_pair = 2.0 * heads * (d_qk + d_v)
    dense_pairs = attended_pairs(t, cache_rows, causal)
    q = t * heads * d_qk * elem_bytes
    o = t * heads * d_v * elem_bytes
    lse = t * heads * LSE_BYTES
    side = heads * 4 if attn_sink else 0  # fp32 sink logits, one per head

    def moved(read_rows: int, with_index: int) -> float:
        fwd = q + read_rows * row_bytes + with_index + side + o + lse
        bwd = (q + read_rows * row_bytes + with_index + side + o + o + lse) + (q + read_rows * d_qk * elem_bytes + side)
        return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[pass_]

    return SparseCounts(slots=slots, rows=rows, flops=per_pair * slots * factor, bytes=moved(rows, index_bytes),
                        dense_pairs=dense_pairs, dense_flops=per_pair * dense_pairs * factor,
                        dense_bytes=moved(cache_rows, 0))

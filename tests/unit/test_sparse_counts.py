"""FLOPs and bytes of index-selected MLA, counted by hand on a small selection."""

from __future__ import annotations

import pytest
import torch

from attnbench.sparse.counts import sparse_counts
from attnbench.sparse.reference import Selection

SEL = Selection(indices=torch.tensor([[0, 1, 1, -1], [9, 10, 2, 3], [4, 4, 4, 4]]), lengths=torch.tensor([4, 3, 2]))
"""Valid slots: 0, 1, 1 | 9, 2 (10 is past the cache, 3 past the length) | 4, 4 — 7 slots, rows {0, 1, 2, 4, 9}."""


def test_forward_counts_the_valid_slots_and_reads_each_distinct_row_once():
    c = sparse_counts(SEL, 10, heads=5)
    assert (c.slots, c.rows) == (7, 5)
    assert c.flops == 2 * 5 * 7 * (576 + 512)
    q, rows, lists, out, lse = 3 * 5 * 576 * 2, 5 * 576 * 2, 12 * 4 + 3 * 4, 3 * 5 * 512 * 2, 3 * 5 * 4
    assert c.bytes == q + rows + lists + out + lse
    assert c.dense_pairs == 8 + 9 + 10  # the last 3 of 10 tokens, causal
    assert c.dense_flops == 2 * 5 * 27 * (576 + 512)
    assert c.dense_bytes == q + 10 * 576 * 2 + out + lse


def test_fp8_rows_sinks_and_an_extra_cache():
    extra = Selection(indices=torch.tensor([[0, 2], [2, 2], [-1, 1]]))
    c = sparse_counts(SEL, 10, heads=5, row_bytes=656, attn_sink=True, extra=extra, extra_rows=3)
    assert (c.slots, c.rows) == (7 + 5, 5 + 3)
    plain = sparse_counts(SEL, 10, heads=5, row_bytes=656)
    assert c.bytes - plain.bytes == 3 * 656 + 6 * 4 + 5 * 4  # its rows, its index lists, the fp32 sink logits
    assert c.flops == 2 * 5 * 12 * (576 + 512)


def test_backward_is_two_and_a_half_forwards_and_writes_the_row_gradients():
    fwd, bwd = sparse_counts(SEL, 10, heads=5), sparse_counts(SEL, 10, heads=5, pass_="bwd")
    assert bwd.flops == 2.5 * fwd.flops and sparse_counts(SEL, 10, heads=5, pass_="fwd_bwd").flops == 3.5 * fwd.flops
    q, rows, out = 3 * 5 * 576 * 2, 5 * 576 * 2, 3 * 5 * 512 * 2
    assert bwd.bytes == fwd.bytes + out + q + rows  # reads dO too; writes dq and the 5 rows' gradients
    with pytest.raises(ValueError, match="unknown pass"):
        sparse_counts(SEL, 10, heads=5, pass_="both")


def test_empty_slots_are_not_counted_as_flashmlas_prefill_benchmark_counts_them():
    flashmla = 2 * int(SEL.lengths.sum()) * 5 * (576 + 512)  # tests/lib.py: every slot within topk_length
    assert sparse_counts(SEL, 10, heads=5).flops < flashmla
    full = Selection(indices=torch.tensor([[0, 1, 2, 3]] * 3))
    assert sparse_counts(full, 10, heads=5).flops == 2 * 12 * 5 * (576 + 512)

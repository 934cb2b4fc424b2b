"""The lightning indexer: exact logits against the formula written out, the top-k, and the selection check passing
the PyTorch baseline and ties while failing wrong selections."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from attnbench.accuracy.reference import BlockSizes
from attnbench.sparse.indexer import (
    causal_bounds,
    check_selection,
    compare_logits,
    draw_indexer_inputs,
    indexer_baseline,
    indexer_logits,
    indexer_topk,
)

TOPK = 13


def inputs(queries: int = 7, keys: int = 37, heads: int = 5, dim: int = 32, seed: int = 0, causal: bool = True):
    return draw_indexer_inputs(queries, keys, heads=heads, dim=dim, causal=causal,
                               generator=torch.Generator().manual_seed(seed))


def written_out(x) -> torch.Tensor:
    """Σ_h w[t,h] · relu(q[t,h] · k[s] · k_scale[s]) for ks[t] <= s < ke[t], a loop over queries and keys, fp64."""
    t_n, s_n = x.q.shape[0], x.k.shape[0]
    out = torch.full((t_n, s_n), -math.inf, dtype=torch.float64)
    for t in range(t_n):
        for s in range(int(x.ks[t]), int(x.ke[t])):
            key = x.k[s].double() * float(x.k_scale[s])
            out[t, s] = sum(float(x.weights[t, h]) * max(0.0, float(x.q[t, h].double() @ key))
                            for h in range(x.q.shape[1]))
    return out


def test_logits_are_the_formula_written_out_and_causal_at_the_lower_right():
    x = inputs()
    assert x.q.dtype == x.k.dtype == torch.float8_e4m3fn
    ref = indexer_logits(x, blocks=BlockSizes(q=3))
    torch.testing.assert_close(ref, written_out(x), rtol=1e-12, atol=1e-12)
    assert torch.isneginf(ref[0, 31:]).all() and torch.isfinite(ref[0, :31]).all()  # query 0 sits at 30
    assert torch.isfinite(ref[-1]).all()
    assert (ref[torch.isfinite(ref)] > 0).any() and (ref[torch.isfinite(ref)] < 0).any()  # weights of both signs


def test_bounds_follow_deepgemms_start_and_end_per_query():
    x = inputs(causal=False)
    assert torch.isfinite(indexer_logits(x)).all()
    ks, ke = torch.tensor([0, 4, 9, 2, 0, 30, 36], dtype=torch.int32), torch.tensor([5, 4, 20, 37, 1, 31, 37],
                                                                                   dtype=torch.int32)
    windowed = replace(x, ks=ks, ke=ke)
    torch.testing.assert_close(indexer_logits(windowed), written_out(windowed), rtol=1e-12, atol=1e-12)
    assert torch.equal(causal_bounds(3, 10)[1], torch.tensor([8, 9, 10], dtype=torch.int32))


def test_topk_is_the_highest_visible_keys_with_minus_one_where_a_query_sees_fewer():
    x = inputs(queries=9, keys=15)  # queries see 7..15 keys
    idx, scores = indexer_topk(x, 11, blocks=BlockSizes(q=2))
    logits = written_out(x)
    for t in range(9):
        seen = 7 + t
        n = min(11, seen)
        want = logits[t].topk(n)
        assert torch.equal(scores[t, :n], want.values) and set(idx[t, :n].tolist()) == set(want.indices.tolist())
        assert (idx[t, n:] == -1).all() and torch.isneginf(scores[t, n:]).all()
    assert idx.dtype == torch.int32


def test_the_baseline_passes_the_check_and_its_logits_match():
    x = inputs(queries=11, keys=61, seed=1)
    logits, chosen = indexer_baseline(x, TOPK)
    verdict = check_selection(chosen, x, TOPK)
    assert verdict.ok and verdict.expected == sum(min(TOPK, 51 + t) for t in range(11))
    assert verdict.worst < 0.01  # fp32 against fp64: far inside one bf16 round-off
    metrics = compare_logits(logits, x)
    assert metrics["rel_l2"] < 1e-6 and metrics["nonfinite"] == 0


def test_logits_rounded_to_bf16_may_pick_other_near_ties_and_still_pass():
    x = inputs(queries=11, keys=61, seed=2)
    logits, _ = indexer_baseline(x, TOPK)
    chosen = logits.bfloat16().float().topk(TOPK, dim=-1).indices.int()  # bf16 ties broken by position
    assert check_selection(chosen, x, TOPK).ok
    assert compare_logits(logits.bfloat16(), x)["rel_l2"] < 2 ** -8


def test_an_exact_tie_may_be_broken_either_way():
    x = inputs(queries=1, keys=20, seed=3, causal=False)
    ref_idx, _ = indexer_topk(x, 4)
    last = int(ref_idx[0, 3])
    k = x.k.clone()
    twin = next(s for s in range(20) if s not in ref_idx[0].tolist())
    k[twin] = k[last]
    tied = replace(x, k=k, k_scale=x.k_scale.clone().index_fill_(0, torch.tensor([twin]), float(x.k_scale[last])))
    mine = ref_idx.clone()
    mine[0, 3] = twin
    assert check_selection(mine, tied, 4).ok and check_selection(ref_idx, tied, 4).ok


def _wrong(kind: str, chosen: torch.Tensor, keys: int) -> torch.Tensor:
    out = chosen.clone()
    if kind == "off by one":
        return torch.where(out >= 0, (out + 1) % keys, out)
    if kind == "a future key":
        out[0, 0] = keys - 1  # query 0 may not see the last key
        return out
    if kind == "a key left out":
        out[:, 0] = -1
        return out
    if kind == "a key twice":
        out[:, 1] = out[:, 0]
        return out
    if kind == "past the cache":
        out[:, 2] = keys + 5
        return out
    raise AssertionError(kind)


WRONG = {"off by one": ("below",), "a future key": ("unseen",), "a key left out": ("missing",),
         "a key twice": ("repeated", "missing"), "past the cache": ("unseen", "missing"),
         "no causal mask": ("unseen",)}


@pytest.mark.parametrize("kind", list(WRONG))
def test_wrong_selections_fail_the_check(kind):
    x = inputs(queries=11, keys=61, seed=4)
    chosen = indexer_topk(x, TOPK)[0]
    if kind == "no causal mask":  # the top k over every key, future ones included
        bad = indexer_topk(replace(x, ke=torch.full_like(x.ke, 61)), TOPK)[0]
    else:
        bad = _wrong(kind, chosen, 61)
    verdict = check_selection(bad, x, TOPK)
    assert not verdict.ok
    for field in WRONG[kind]:
        assert getattr(verdict, field) > 0, field
    if kind == "off by one":
        assert verdict.mismatched > 0 and verdict.worst > 1


def test_a_wrong_selection_of_the_lowest_keys_counts_them_below_the_kth():
    x = inputs(queries=11, keys=61, seed=5)
    logits = indexer_logits(x)
    lowest = logits.masked_fill(torch.isneginf(logits), math.inf).topk(TOPK, largest=False).indices.int()
    verdict = check_selection(lowest, x, TOPK)
    assert verdict.below == 11 * TOPK and not verdict.ok


def test_wrong_logits_are_seen_by_the_comparison():
    x = inputs(queries=9, keys=41, seed=6)
    logits, _ = indexer_baseline(x, TOPK)
    no_relu = torch.einsum("thd,sd,th->ts", x.q.float(), x.k.float() * x.k_scale[:, None], x.weights)
    assert compare_logits(no_relu, x)["rel_l2"] > 0.1
    assert compare_logits(logits * 1.01, x)["rel_l2"] > 0.005
    filled = logits.masked_fill(torch.isneginf(logits), 7.0)  # what a kernel leaves unseen is not compared
    assert compare_logits(filled, x)["rel_l2"] < 1e-6


def test_the_check_does_not_depend_on_the_blocks():
    x = inputs(queries=13, keys=45, seed=7)
    chosen = _wrong("off by one", indexer_topk(x, TOPK)[0], 45)
    assert check_selection(chosen, x, TOPK) == check_selection(chosen, x, TOPK, blocks=BlockSizes(q=2))

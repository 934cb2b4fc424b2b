"""Index lists of a case: each pattern names distinct visible keys, as many as the query can fill, −1 after; a
seeded case is the same every time and its options do what they say."""

from __future__ import annotations

import pytest
import torch

from attnbench.sparse.indexer import draw_indexer_inputs, indexer_logits
from attnbench.sparse.indices import PATTERNS, make_case, make_indices, positions, visible_keys

S_Q, S_KV, TOPK = 9, 23, 17  # the first query sees 15 keys: fewer than TOPK


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_pattern_names_distinct_visible_keys_then_minus_one(pattern):
    idx = make_indices(pattern, S_Q, S_KV, TOPK, generator=_gen())
    assert idx.shape == (S_Q, TOPK) and idx.dtype == torch.int32
    for t, pos in enumerate(positions(S_Q, S_KV).tolist()):
        n = min(TOPK, pos + 1)
        row = idx[t].tolist()
        assert all(0 <= r <= pos for r in row[:n]) and len(set(row[:n])) == n, (t, row)
        assert row[n:] == [-1] * (TOPK - n)


def test_prefix_and_window_are_the_first_and_the_newest_keys():
    prefix = make_indices("prefix", S_Q, S_KV, TOPK, generator=_gen())
    window = make_indices("window", S_Q, S_KV, TOPK, generator=_gen())
    assert prefix[0, :15].tolist() == list(range(15)) and prefix[-1].tolist() == list(range(TOPK))
    assert window[0, :15].tolist() == list(range(14, -1, -1)) and window[-1].tolist() == list(range(22, 5, -1))


def test_without_causality_every_key_is_visible():
    assert visible_keys(S_Q, S_KV, causal=False).tolist() == [S_KV] * S_Q
    idx = make_indices("random", S_Q, S_KV, TOPK, generator=_gen(), causal=False)
    assert (idx >= 0).all() and int(idx.max()) > 14  # query 0 reaches past its own position
    few = make_indices("random", 2, 5, 8, generator=_gen(), causal=False)  # a cache shorter than the lists
    assert (few[:, 5:] == -1).all() and sorted(few[0, :5].tolist()) == [0, 1, 2, 3, 4]


def test_indexer_indices_are_the_highest_scoring_tokens_of_the_seeded_inputs():
    idx = make_indices("indexer", S_Q, S_KV, TOPK, generator=_gen(4))
    logits = indexer_logits(draw_indexer_inputs(S_Q, S_KV, generator=_gen(4)))
    for t in range(S_Q):
        n = int((idx[t] >= 0).sum())
        picked = logits[t, idx[t, :n].long()]
        assert float(picked.min()) >= float(logits[t].topk(n).values.min())
        assert (picked[:-1] >= picked[1:]).all()  # highest first


def test_random_patterns_follow_the_seed():
    one = make_indices("random", S_Q, S_KV, TOPK, generator=_gen(1))
    assert torch.equal(one, make_indices("random", S_Q, S_KV, TOPK, generator=_gen(1)))
    assert not torch.equal(one, make_indices("random", S_Q, S_KV, TOPK, generator=_gen(2)))
    with pytest.raises(ValueError, match="unknown index pattern"):
        make_indices("strided", S_Q, S_KV, TOPK, generator=_gen())


def test_a_case_is_seeded_and_its_options_do_what_they_say():
    kw = dict(attn_sink=True, lengths=True, empty=0.25, repeats=0.25, extra=(11, 5), seed=7)
    case = make_case(S_Q, S_KV, 5, TOPK, **kw)
    again = make_case(S_Q, S_KV, 5, TOPK, **kw)
    assert torch.equal(case.q, again.q) and torch.equal(case.selection.indices, again.selection.indices)
    idx = case.selection.indices
    assert ((idx == -1).sum() > 0) and ((idx >= S_KV).sum() > 0)  # both kinds of empty slot
    assert any(len(set(r)) < len(r) for r in idx.clamp(min=-1).tolist())  # a repeated index
    assert case.selection.lengths is not None and case.selection.lengths.max() <= TOPK
    assert case.extra_kv.shape == (11, 576) and case.extra.indices.shape == (S_Q, 5)
    assert case.attn_sink.shape == (5,) and case.attn_sink.dtype == torch.float32
    assert case.q.shape == (S_Q, 5, 576) and case.kv.shape == (S_KV, 576) and case.dout.shape == (S_Q, 5, 512)
    assert case.q.dtype == torch.bfloat16
    plain = make_case(S_Q, S_KV, 5, TOPK, seed=7)
    assert plain.attn_sink is None and plain.extra is None and plain.selection.lengths is None
    assert torch.equal(plain.q, case.q) and torch.equal(plain.kv, case.kv)

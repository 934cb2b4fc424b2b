"""Index-selected MLA: the exact reference against the definition written out as a loop over each query's slots
(fp64, autograd for the gradients), on odd sizes, with every slot semantic FlashMLA defines."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.accuracy.reference import BlockSizes
from attnbench.sparse.indices import make_case
from attnbench.sparse.reference import Selection, reference_sparse, sparse_forward

SMALL = dict(dim=19, d_v=11, scale=19 ** -0.5)
"""A row of 19 whose first 11 dims are the value: odd stand-ins for 576 / 512."""
TIGHT = dict(rtol=0, atol=1e-12)


def _slots(cache, selection, t):
    """The rows query t attends in one cache, one per valid slot, in slot order."""
    if cache is None:
        return []
    out = []
    for j in range(selection.indices.shape[1]):
        r = int(selection.indices[t, j])
        counts = selection.lengths is None or j < int(selection.lengths[t])
        if counts and 0 <= r < cache.shape[0]:
            out.append(cache[r])
    return out


def written_out(q, kv, selection, *, scale, d_v, attn_sink=None, extra_kv=None, extra=None):
    """(out (T, H, d_v), lse (H, T), max_logits (H, T)), one query at a time: softmax over the rows its slots name
    (a repeated index once per slot), the sink in the denominator only, no slot: out 0 and lse −inf."""
    outs, lses, tops = [], [], []
    heads = q.shape[1]
    for t in range(q.shape[0]):
        rows = _slots(kv, selection, t) + _slots(extra_kv, extra, t)
        if not rows:
            outs.append(q.new_zeros(heads, d_v))
            lses.append(q.new_full((heads,), -math.inf))
            tops.append(q.new_full((heads,), -math.inf))
            continue
        keys = torch.stack(rows)
        s = scale * q[t] @ keys.T
        lse = torch.logsumexp(s, dim=-1)
        denominator = lse if attn_sink is None else torch.logaddexp(lse, attn_sink)
        outs.append(torch.exp(s - denominator[:, None]) @ keys[:, :d_v])
        lses.append(lse)
        tops.append(s.amax(dim=-1))
    return torch.stack(outs), torch.stack(lses).T, torch.stack(tops).T


CASES = {
    "plain": dict(),
    "empty slots": dict(empty=0.3),
    "repeated indices": dict(repeats=0.4),
    "lengths": dict(lengths=True),
    "sink": dict(attn_sink=True),
    "extra cache": dict(extra=(23, 9)),
    "all at once": dict(empty=0.2, repeats=0.3, lengths=True, attn_sink=True, extra=(23, 9)),
    "window": dict(pattern="window", attn_sink=True),
    "prefix": dict(pattern="prefix", lengths=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_is_the_written_out_loop_forward_and_backward(name):
    case = make_case(7, 37, 5, 13, dtype=torch.float64, seed=3, **SMALL, **CASES[name])
    ref = reference_sparse(case.q, case.kv, case.selection, blocks=BlockSizes(q=3), **case.kwargs())
    leaves = {n: t.clone().double().requires_grad_(True) for n, t in
              (("q", case.q), ("kv", case.kv), ("extra_kv", case.extra_kv), ("attn_sink", case.attn_sink)) if t is not None}
    out, lse, top = written_out(leaves["q"], leaves["kv"], case.selection, scale=case.scale, d_v=case.d_v,
                                attn_sink=leaves.get("attn_sink"), extra_kv=leaves.get("extra_kv"), extra=case.extra)
    torch.testing.assert_close(ref.out, out.detach(), **TIGHT)
    torch.testing.assert_close(ref.lse, lse.detach(), **TIGHT)
    torch.testing.assert_close(ref.max_logits, top.detach(), **TIGHT)
    grads = torch.autograd.grad(out, list(leaves.values()), case.dout)
    for leaf, grad in zip(leaves, grads):
        torch.testing.assert_close(ref["d" + leaf], grad, **TIGHT, msg=leaf)
    assert set(ref) == {"out", "lse", "max_logits"} | {"d" + n for n in leaves}


def test_each_semantic_changes_the_answer_of_the_odd_case():
    """The written-out cases above are not vacuous: every option moves the output of the plain case."""
    plain = make_case(7, 37, 5, 13, dtype=torch.float64, seed=3, **SMALL)
    base = reference_sparse(plain.q, plain.kv, plain.selection, **plain.kwargs()).out
    for name in ("empty slots", "repeated indices", "lengths", "sink", "extra cache"):
        case = make_case(7, 37, 5, 13, dtype=torch.float64, seed=3, **SMALL, **CASES[name])
        got = reference_sparse(case.q, case.kv, case.selection, **case.kwargs()).out
        assert (got - base).norm() > 0.05 * base.norm(), name


def test_a_repeated_index_counts_once_per_slot_and_its_row_gradient_adds_up():
    q = torch.randn(1, 3, 19, dtype=torch.float64)
    kv = torch.randn(5, 19, dtype=torch.float64)
    dout = torch.randn(1, 3, 11, dtype=torch.float64)
    twice = reference_sparse(q, kv, Selection(indices=torch.tensor([[2, 4, 2]])), scale=0.3, d_v=11, dout=dout)
    once = reference_sparse(q, kv, Selection(indices=torch.tensor([[2, 4]])), scale=0.3, d_v=11, dout=dout)
    s = 0.3 * q[0] @ kv[[2, 4]].T  # (H, 2): row 2 weighs twice in the first
    w = torch.softmax(torch.stack([s[:, 0] + math.log(2), s[:, 1]], dim=-1), dim=-1)
    torch.testing.assert_close(twice.out[0], w @ kv[[2, 4], :11], **TIGHT)
    assert not torch.allclose(twice.out, once.out)
    assert twice.dkv[[0, 1, 3]].abs().max() == 0 and twice.dkv[2].abs().max() > 0


def test_indices_out_of_the_cache_and_past_the_length_are_empty_whatever_their_value():
    q = torch.randn(2, 3, 19, dtype=torch.float64)
    kv = torch.randn(6, 19, dtype=torch.float64)
    kw = dict(scale=0.3, d_v=11)
    odd = Selection(indices=torch.tensor([[1, -1, 6, -2**31, 3, 2**31 - 1], [0, 5, 2, 4, 1, 3]]),
                    lengths=torch.tensor([6, 2]))
    clean = Selection(indices=torch.tensor([[1, 3], [0, 5]]))
    torch.testing.assert_close(sparse_forward(q, kv, odd, **kw), sparse_forward(q, kv, clean, **kw), **TIGHT)


def test_a_query_with_no_valid_slot_gives_zero_output_and_minus_inf_lse_whatever_its_sink():
    q = torch.randn(3, 5, 19, dtype=torch.float64)
    kv = torch.randn(8, 19, dtype=torch.float64)
    sel = Selection(indices=torch.tensor([[1, 2], [-1, 9], [3, 4]]), lengths=torch.tensor([2, 2, 0]))
    ref = reference_sparse(q, kv, sel, scale=0.3, d_v=11, attn_sink=torch.randn(5, dtype=torch.float64),
                           dout=torch.randn(3, 5, 11, dtype=torch.float64))
    for t in (1, 2):
        assert ref.out[t].abs().max() == 0 and ref.dq[t].abs().max() == 0
        assert torch.isneginf(ref.lse[:, t]).all() and torch.isneginf(ref.max_logits[:, t]).all()
    assert ref.out[0].abs().max() > 0 and torch.isfinite(ref.dattn_sink).all()


def test_infinite_sinks_are_taken_as_flashmla_takes_them():
    """+inf: the output is 0; −inf: no effect; neither changes the lse (FlashMLA's lse leaves the sink out)."""
    case = make_case(5, 29, 3, 7, dtype=torch.float64, seed=1, **SMALL)
    none = reference_sparse(case.q, case.kv, case.selection, scale=case.scale, d_v=case.d_v)
    attn_sink = torch.tensor([math.inf, -math.inf, 0.5], dtype=torch.float64)
    ref = reference_sparse(case.q, case.kv, case.selection, scale=case.scale, d_v=case.d_v, attn_sink=attn_sink,
                           dout=case.dout)
    assert ref.out[:, 0].abs().max() == 0
    torch.testing.assert_close(ref.out[:, 1], none.out[:, 1], **TIGHT)
    assert (ref.out[:, 2] - none.out[:, 2]).abs().max() > 1e-3
    torch.testing.assert_close(ref.lse, none.lse, **TIGHT)
    assert torch.isfinite(ref.dattn_sink).all() and ref.dattn_sink[:2].abs().max() == 0


def test_one_kv_head_shared_by_every_query_head_in_either_cache_shape():
    case = make_case(7, 37, 5, 13, dtype=torch.float64, seed=2)  # DeepSeek's 576 / 512
    flat = reference_sparse(case.q, case.kv, case.selection, **case.kwargs())
    headed = reference_sparse(case.q, case.kv[:, None], case.selection, **case.kwargs())
    assert flat.out.shape == (7, 5, 512) and flat.dq.shape == (7, 5, 576) and flat.lse.shape == (5, 7)
    assert headed.dkv.shape == (37, 1, 576)
    torch.testing.assert_close(headed.dkv[:, 0], flat.dkv, **TIGHT)
    torch.testing.assert_close(headed.out, flat.out, **TIGHT)
    with pytest.raises(ValueError, match="one KV head"):
        reference_sparse(case.q, case.kv.view(37, 2, 288).repeat(1, 1, 2), case.selection, scale=0.1)


def test_rows_no_slot_names_never_reach_the_result_even_as_nan():
    """FlashMLA's decode tests fill every unused cache row with NaN; the reference must not read them."""
    case = make_case(5, 31, 3, 7, dtype=torch.float64, seed=4, empty=0.3, lengths=True, **SMALL)
    used = torch.zeros(31, dtype=torch.bool)
    used[case.selection.indices[case.selection.valid(31)].long()] = True
    poisoned = case.kv.masked_fill(~used[:, None], math.nan)
    clean = reference_sparse(case.q, case.kv, case.selection, **case.kwargs())
    ref = reference_sparse(case.q, poisoned, case.selection, **case.kwargs())
    for name in ("out", "lse", "dq"):
        torch.testing.assert_close(ref[name], clean[name], **TIGHT)
    assert torch.isfinite(ref.dkv).all() and ref.dkv[~used].abs().max() == 0


def test_blocks_of_queries_do_not_change_the_result():
    case = make_case(11, 41, 3, 9, dtype=torch.float64, seed=5, attn_sink=True, extra=(13, 5), empty=0.2, **SMALL)
    whole = reference_sparse(case.q, case.kv, case.selection, **case.kwargs())
    pieces = reference_sparse(case.q, case.kv, case.selection, blocks=BlockSizes(q=4, max_elems=5 * 19 * 14),
                              **case.kwargs())
    for name in whole:
        torch.testing.assert_close(pieces[name], whole[name], **TIGHT, msg=name)


def test_bf16_inputs_are_computed_in_fp64_on_the_cpu():
    case = make_case(3, 17, 2, 5, seed=6, **SMALL)
    assert case.q.dtype == torch.bfloat16
    ref = reference_sparse(case.q, case.kv, case.selection, **case.kwargs())
    assert {t.dtype for t in ref.tensors().values()} == {torch.float64}
    exact = reference_sparse(case.q.double(), case.kv.double(), case.selection, **case.kwargs())
    torch.testing.assert_close(ref.out, exact.out, **TIGHT)

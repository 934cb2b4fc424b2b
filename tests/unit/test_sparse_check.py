"""Index-selected MLA in bf16: the metrics the project judges kernels by (``accuracy.compare``) pass a correct
kernel and the plain-math baseline and fail each way a kernel could get the slots wrong."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from attnbench.accuracy.compare import compare
from attnbench.outputs import Outputs
from attnbench.sparse.baseline import baseline_sparse
from attnbench.sparse.indices import make_case
from attnbench.sparse.reference import Selection, reference_sparse

U = 2 ** -8
"""bf16's unit round-off."""
ROUNDING = 2 * U
"""rel-L2 a correct bf16 kernel stays within: two round-offs (the verdict's floor, ``accuracy/tolerance.py``)."""
WRONG = 10 * ROUNDING
"""rel-L2 every mistake must exceed: far from anything rounding does."""


@pytest.fixture(scope="module")
def case():
    return make_case(33, 301, 5, 61, seed=11, attn_sink=True, lengths=True, empty=0.2, repeats=0.15, extra=(57, 19))


@pytest.fixture(scope="module")
def ref(case):
    return reference_sparse(case.q, case.kv, case.selection, **case.kwargs())


@pytest.fixture(scope="module")
def right(case, ref):
    """The correct kernel's metrics."""
    return compare(kernel(case).tensors(), ref.tensors())


def _once(selection: Selection) -> Selection:
    """Each repeated index kept in its first slot only (the others emptied)."""
    idx = selection.indices.clone()
    for row in idx:
        seen = set()
        for j, r in enumerate(row.tolist()):
            if r in seen:
                row[j] = -1
            seen.add(r)
    return Selection(indices=idx, lengths=selection.lengths)


def kernel(case, mistake: str | None = None) -> Outputs:
    """A kernel's arithmetic (fp32 from the bf16 inputs, results rounded to bf16 as FlashMLA returns them), with one
    mistake made on the way in."""
    kw = case.kwargs()
    sel = case.selection
    if mistake == "index off by one":
        sel = Selection(indices=torch.where(sel.indices >= 0, sel.indices + 1, sel.indices), lengths=sel.lengths)
    elif mistake == "-1 read as token 0":
        sel = Selection(indices=torch.where(sel.indices == -1, 0, sel.indices), lengths=sel.lengths)
    elif mistake == "lengths ignored":
        sel = Selection(indices=sel.indices)
    elif mistake == "extra cache dropped":
        kw.update(extra_kv=None, extra=None)
    elif mistake == "sink ignored":
        kw.update(attn_sink=None)
    elif mistake == "repeats counted once":
        sel = _once(sel)
    elif mistake is not None:
        raise AssertionError(mistake)
    got = reference_sparse(case.q, case.kv, sel, dtype=torch.float32, **kw)
    return Outputs(**{name: (t if name in ("lse", "max_logits") else t.bfloat16()) for name, t in got.tensors().items()})


MISTAKES = ("index off by one", "-1 read as token 0", "lengths ignored", "extra cache dropped", "sink ignored",
            "repeats counted once")


def test_the_case_makes_every_mistake_possible(case):
    idx = case.selection.indices
    assert (idx == -1).any() and (idx >= case.kv.shape[0]).any() and (case.selection.lengths < idx.shape[1]).any()
    assert any(len(set(r)) < len(r) for r in idx.tolist())
    share = torch.sigmoid(case.attn_sink.double()[:, None] - reference_sparse(
        case.q, case.kv, case.selection, **{**case.kwargs(), "dout": None}).lse)
    assert 0.1 < float(share.mean()) < 0.9  # the sink logits take a real share of the rows


def test_a_correct_kernel_is_within_bf16_rounding(right):
    metrics = right
    assert set(metrics) == {"out", "lse", "max_logits", "dq", "dkv", "dextra_kv", "dattn_sink"}
    for name, m in metrics.items():
        assert m["rel_l2"] < ROUNDING, (name, m["rel_l2"])
        assert m["nonfinite"] == 0 and "inf_mismatch" not in m


def test_the_plain_bf16_baseline_is_bf16_sized(case, ref):
    metrics = compare(baseline_sparse(case.q, case.kv, case.selection, **case.kwargs()).tensors(), ref.tensors())
    assert set(metrics) == {"out", "lse", "dq", "dkv", "dextra_kv", "dattn_sink"}
    for name, m in metrics.items():
        assert 0 < m["rel_l2"] < 8 * U, (name, m["rel_l2"])


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_is_far_above_bf16_rounding(case, ref, right, mistake):
    metrics = compare(kernel(case, mistake).tensors(), ref.tensors())
    assert right["out"]["rel_l2"] < ROUNDING < WRONG < metrics["out"]["rel_l2"], metrics["out"]["rel_l2"]


def test_flashmlas_plus_inf_lse_of_an_empty_query_counts_as_the_references_minus_inf():
    case = make_case(5, 29, 3, 7, seed=2, lengths=True)
    sel = Selection(indices=case.selection.indices, lengths=torch.tensor([0, 3, 7, 0, 5]))
    ref = reference_sparse(case.q, case.kv, sel, scale=case.scale, d_v=case.d_v)
    got = kernel(replace(case, selection=sel, dout=None))
    lse = got.lse.clone()
    lse[:, [0, 3]] = math.inf  # what FlashMLA writes for a query with no valid slot
    m = compare({"lse": lse, "out": got.out}, ref.tensors())
    assert m["lse"]["nonfinite"] == 0 and "inf_mismatch" not in m["lse"] and m["lse"]["rel_l2"] < ROUNDING
    lse[:, 0] = 0.0  # a finite lse where there is no key is caught
    assert compare({"lse": lse}, ref.tensors())["lse"]["inf_mismatch"] == 3

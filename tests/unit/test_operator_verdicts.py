"""The verdict of sparse MLA, the indexer and the recurrences: a kernel wrong in any way its contract allows fails on
the run's own inputs, and correct kernels pass.

Each wrong kernel is a correct one (``sparse-torch``'s arithmetic, ``torch-chunked``, ``indexer-torch``) with one
mistake: a slot kind misread (−1 as row 0 or as the last row, an index past the cache read, a repeated slot counted
once), a sink rounded to bf16, an LSE returned in bf16, a tensor 1% off (or one head of it), an initial state or a
sequence boundary ignored. Every case comes from the operators' own generators (``make_inputs`` of the case the run
would draw), so a mistake the run's inputs cannot reveal fails here too.
"""

from __future__ import annotations

import pytest
import torch

from attnbench import operators
from attnbench.accuracy.check import AccuracyChecker
from attnbench.accuracy.compare import tensor_metrics
from attnbench.accuracy.tolerance import judge
from attnbench.backends import registry
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs
from attnbench.sparse.reference import Selection, reference_sparse
from attnbench.sparse.spec import INVALID_RATE, SparseSpec

CPU = torch.device("cpu")


def inputs_of(spec, seed: int = 0):
    return operators.of(spec).make_inputs(spec, CPU, seed)


def verdict(spec, outputs: Outputs, backend: str, inputs) -> dict:
    return AccuracyChecker(cache_size=1)(spec, inputs, outputs, registry.get(backend))


# ---- sparse MLA ---------------------------------------------------------------------------------------------------
SPARSE = dict(s_q=256, s_kv=256, heads=16, topk=128, invalid=INVALID_RATE)
"""The CPU run's default case: a fresh sequence's prefill, its first queries short of top-k keys, empty slots."""


def sparse_kernel(spec: SparseSpec, inputs, mistake: str | None = None) -> Outputs:
    """A kernel's arithmetic (fp32 from the bf16 inputs, out rounded to bf16, lse fp32, as FlashMLA returns them)
    with one mistake made on the way in."""
    kw = inputs.kwargs(spec)
    sel = inputs.selection
    idx, rows = sel.indices, inputs.kv.shape[0]
    if mistake == "-1 read as row 0":
        sel = Selection(indices=torch.where(idx == -1, 0, idx), lengths=sel.lengths)
    elif mistake == "-1 read as the last row":
        sel = Selection(indices=torch.where(idx == -1, rows - 1, idx), lengths=sel.lengths)
    elif mistake == "past the cache read":
        sel = Selection(indices=torch.where(idx >= rows, rows - 1, idx), lengths=sel.lengths)
    elif mistake == "repeats counted once":
        first = torch.ones_like(idx, dtype=torch.bool)
        for j in range(1, idx.shape[1]):
            first[:, j] = ~(idx[:, :j] == idx[:, j:j + 1]).any(dim=1)
        sel = Selection(indices=torch.where(first, idx, -1), lengths=sel.lengths)
    elif mistake == "lengths ignored":
        sel = Selection(indices=idx)
    elif mistake == "sink rounded to bf16":
        kw["attn_sink"] = kw["attn_sink"].bfloat16().float()
    elif mistake is not None:
        raise AssertionError(mistake)
    got = reference_sparse(inputs.q, inputs.kv, sel, dtype=torch.float32, **kw)
    return Outputs(out=got.out.bfloat16(), lse=got.lse)


def test_the_runs_own_sparse_inputs_hold_every_slot_kind():
    """The CPU default case has −1 slots in the middle of lists, indices past the cache, and queries that see fewer
    keys than top-k; with --repeated-slots, repeated rows."""
    (spec,) = operators.get("sparse-mla").sweep({}, {"small": True})
    assert spec.s_q == spec.s_kv and spec.invalid == INVALID_RATE
    idx = inputs_of(spec).selection.indices
    assert bool((idx[:spec.topk - 1] == -1).any(dim=1).all())  # short of keys: each of the first queries
    middle = idx[spec.topk:]  # queries that see top-k keys: any −1 there is a drawn empty slot
    assert bool((middle == -1).any()) and bool((idx >= spec.cache_rows).any())
    repeated = SparseSpec(**{**SPARSE, "repeats": 0.05})
    ridx = inputs_of(repeated).selection.indices
    dup = ((ridx[:, :, None] == ridx[:, None, :]) & (ridx[:, :, None] >= 0)).sum() - (ridx >= 0).sum()
    assert int(dup) > 0
    decode = SparseSpec(batch=2, s_q=2, s_kv=512, heads=16, topk=128, invalid=INVALID_RATE, decode=True)
    didx = inputs_of(decode).selection.indices
    assert bool((didx == -1).any()) and not bool((didx >= decode.cache_rows).any())  # FP8 decode knows only −1


def test_slot_kinds_leave_the_other_tensors_and_old_case_ids_alone():
    plain, mixed = SparseSpec(**{**SPARSE, "invalid": 0.0}), SparseSpec(**SPARSE)
    a, b = inputs_of(plain), inputs_of(mixed)
    assert torch.equal(a.q, b.q) and torch.equal(a.kv, b.kv) and torch.equal(a.dout, b.dout)
    assert "invalid" not in plain.to_dict() and "repeats" not in plain.to_dict()  # the stored case as before
    assert SparseSpec.from_dict(mixed.to_dict()) == mixed


@pytest.mark.parametrize("mistake", ["-1 read as row 0", "-1 read as the last row", "past the cache read",
                                     "repeats counted once", "lengths ignored", "sink rounded to bf16"])
def test_a_sparse_kernel_that_misreads_a_slot_or_the_sink_fails(mistake):
    spec = SparseSpec(**SPARSE, sink=mistake == "sink rounded to bf16", topk_length=mistake == "lengths ignored",
                      repeats=0.05 if mistake == "repeats counted once" else 0.0)
    inputs = inputs_of(spec)
    assert verdict(spec, sparse_kernel(spec, inputs), "sparse-torch", inputs)["verdict"] == "pass"
    acc = verdict(spec, sparse_kernel(spec, inputs, mistake), "sparse-torch", inputs)
    assert acc["verdict"] == "fail", (mistake, acc["worst"])


@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
def test_one_sparse_head_one_percent_off_fails(sink):
    spec = SparseSpec(**SPARSE, sink=sink)
    inputs = inputs_of(spec)
    right = sparse_kernel(spec, inputs)
    out = right.out.clone()
    out[:, 5] = (out[:, 5].float() * 1.01).bfloat16()
    acc = verdict(spec, right.replace(out=out), "sparse-torch", inputs)
    assert acc["verdict"] == "fail" and "out head_scale" in acc["reason"], acc["worst"]


def test_an_lse_returned_in_bf16_is_judged_in_fp32_and_fails():
    spec = SparseSpec(**SPARSE)
    inputs = inputs_of(spec)
    right = sparse_kernel(spec, inputs)
    for lse in (right.lse.bfloat16(), (right.lse * 1.02).bfloat16()):
        acc = verdict(spec, right.replace(lse=lse), "sparse-torch", inputs)
        assert acc["verdict"] == "fail" and "lse" in acc["reason"] and "fp32 floor" in acc["reason"]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_top_k_of_one_is_no_false_alarm(dtype):
    """One slot: the LSE is one score, a dot product of 576 terms; its floor counts them."""
    spec = SparseSpec(s_q=64, s_kv=512, heads=16, topk=1, dtype=dtype)
    inputs = inputs_of(spec)
    for name in ("sparse-torch", "flex-sparse-mla"):
        acc = verdict(spec, registry.get(name).prepare(spec, inputs).fn(), name, inputs)
        assert acc["verdict"] == "pass", (name, acc.get("reason"))


def test_the_sparse_yardstick_keeps_the_sink_and_the_lse_in_fp32():
    spec = SparseSpec(**SPARSE, sink=True, pass_="fwd_bwd")
    inputs = inputs_of(spec)
    acc = verdict(spec, registry.get("sparse-torch").prepare(spec, inputs).fn(), "sparse-torch", inputs)
    assert acc["verdict"] == "pass", acc.get("reason")
    assert abs(acc["baseline"]["out"]["head_scale"]) < 1e-3  # a bf16 sink biased a head's output by up to 0.7%
    assert acc["tensors"]["lse"]["dtype"] == "float32"


# ---- the indexer --------------------------------------------------------------------------------------------------
def test_an_indexer_that_pads_with_keys_a_query_cannot_see_fails_on_the_runs_own_case():
    (spec,) = operators.get("indexer").sweep({}, {"small": True})
    assert spec.s_q == spec.s_kv  # a fresh sequence: its first queries see fewer keys than top-k
    inputs = inputs_of(spec)
    right = registry.get("indexer-torch").prepare(spec, inputs).fn()
    assert verdict(spec, right, "indexer-torch", inputs)["verdict"] == "pass"
    idx = right.indices.clone()
    pos = torch.arange(idx.shape[0])[:, None] + (spec.s_kv - spec.s_q)
    padded = torch.where(idx == -1, (pos + 1 + torch.arange(idx.shape[1])).clamp(max=spec.s_kv - 1), idx)
    acc = verdict(spec, Outputs(indices=padded.to(idx.dtype)), "indexer-torch", inputs)
    assert acc["verdict"] == "fail" and "unseen" in acc["reason"]


# ---- the recurrences ----------------------------------------------------------------------------------------------
def recurrence(kind: str, **kw) -> RecurrenceSpec:
    (spec,) = operators.get("recurrence").sweep({"seq_lens": [kw.pop("seqlens", (600,))], "q_heads": [2],
                                                 "v_heads": [4], "head_sizes": [32],
                                                 "head_sizes_v": [16] if kind == "mamba2" else None,
                                                 "passes": ["fwd_bwd"], "dtypes": [kw.pop("dtype", "bf16")]},
                                                {"kind": kind, "chunk": 32})
    return spec.replace(**kw)


def chunked(spec, inputs) -> Outputs:
    return registry.get("torch-chunked").prepare(spec, inputs).fn()


def test_the_runs_recurrence_cases_start_from_a_state():
    assert recurrence("gdn").initial_state and "dinitial_state" in operators.of(recurrence("gdn")).wanted(
        recurrence("gdn"))


@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2"])
@pytest.mark.parametrize("wrong", ["dv", "out", "dq"])
def test_a_recurrence_tensor_one_percent_off_fails_in_bf16(kind, wrong):
    spec = recurrence(kind)
    inputs = inputs_of(spec)
    right = chunked(spec, inputs)
    assert verdict(spec, right, "torch-chunked", inputs)["verdict"] == "pass"
    t = right.tensors()[wrong]
    acc = verdict(spec, right.replace(**{wrong: (t.float() * 1.01).to(t.dtype)}), "torch-chunked", inputs)
    assert acc["verdict"] == "fail", acc["worst"]


def test_a_decay_gradient_five_percent_off_and_one_head_one_percent_off_fail():
    spec = recurrence("gdn", seqlens=(1000,))
    inputs = inputs_of(spec)
    right = chunked(spec, inputs)
    acc = verdict(spec, right.replace(dg=right.dg * 1.05), "torch-chunked", inputs)
    assert acc["verdict"] == "fail" and "dg" in acc["reason"]
    out = right.out.clone()
    out[..., 1, :] = (out[..., 1, :].float() * 1.01).to(out.dtype)
    acc = verdict(spec, right.replace(out=out), "torch-chunked", inputs)
    assert acc["verdict"] == "fail" and "out head_scale" in acc["reason"], acc["worst"]


def test_a_kernel_that_ignores_the_initial_state_fails():
    spec = recurrence("gdn", pass_="fwd")
    inputs = inputs_of(spec)
    from dataclasses import replace
    cold = replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
    acc = verdict(spec, chunked(spec, cold), "torch-chunked", inputs)
    assert acc["verdict"] == "fail" and "out" in acc["reason"]


def test_a_kernel_that_carries_the_state_over_a_sequence_boundary_fails():
    spec = recurrence("gdn", seqlens=(37, 300, 5), pass_="fwd")
    inputs = inputs_of(spec)
    assert verdict(spec, chunked(spec, inputs), "torch-chunked", inputs)["verdict"] == "pass"
    whole = spec.replace(seqlens=(342,), initial_state=False)
    from dataclasses import replace
    packed = replace(inputs, cu_seqlens=None, initial_state=None,
                     dfinal_state=torch.zeros(whole.state_shape))
    out = chunked(whole, packed).out
    wrong = chunked(spec, inputs).replace(out=out)
    acc = verdict(spec, wrong, "torch-chunked", inputs)
    assert acc["verdict"] == "fail"


@pytest.mark.parametrize("case", [
    dict(kind="mamba2", dtype="fp32"), dict(kind="mamba2", dtype="bf16"),
    dict(kind="kda", dtype="fp32", decay_bound=-5.0), dict(kind="kda", dtype="fp64", decay_bound=-5.0),
    dict(kind="gdn", dtype="bf16", seqlens=(37, 100, 5))], ids=str)
def test_correct_recurrence_kernels_raise_no_false_alarm(case):
    case = dict(case)
    kind = case.pop("kind")
    spec = recurrence(kind, seqlens=case.pop("seqlens", (150,)), dtype=case.pop("dtype"))
    spec = spec.replace(**case)
    inputs = inputs_of(spec)
    for name in ("torch-recurrent", "torch-chunked"):
        acc = verdict(spec, registry.get(name).prepare(spec, inputs).fn(), name, inputs)
        assert acc["verdict"] == "pass", (name, acc.get("reason"))


def test_kda_decode_gradients_count_their_state_sums():
    (spec,) = operators.get("recurrence").sweep({"q_heads": [2], "head_sizes": [32], "batch_sizes": [3],
                                                 "passes": ["fwd_bwd"], "dtypes": ["fp32"]},
                                                {"kind": "kda", "decode": True})
    inputs = inputs_of(spec)
    for name in ("torch-recurrent", "torch-chunked"):
        acc = verdict(spec, registry.get(name).prepare(spec, inputs).fn(), name, inputs)
        assert acc["verdict"] == "pass", (name, acc.get("reason"))


# ---- the rules ----------------------------------------------------------------------------------------------------
def test_per_head_measures_find_one_head_that_the_blocks_hide():
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(512, 128, 64, generator=gen, dtype=torch.float64)
    x = (y + 0.004 * y.abs() * torch.randn(y.shape, generator=gen, dtype=torch.float64)).bfloat16().double()
    x[:, 7] *= 1.01
    m = tensor_metrics(x, y, token_dim=-3, head_dim=-2)
    assert m["head_scale"] == pytest.approx(0.01, abs=1e-3)
    assert abs(m["scale"]) < 2e-4  # one head of 128: diluted in the whole tensor


def test_small_tensors_are_judged_element_wise_and_noise_gets_its_allowance():
    small = {"max_abs": 1e-3, "mean_abs": 1e-4, "rel_l2": 1e-3, "numel": 80, "scale": 0.02, "ref_max_abs": 1.0,
             "ref_mean_abs": 0.5}
    base = {"max_abs": 1e-3, "mean_abs": 1e-4, "rel_l2": 1e-3, "scale": 0.0}
    assert judge({"dA": small}, {"dA": base}, "bf16", exact=True)["verdict"] == "pass"
    big = dict(small, numel=100_000)
    assert judge({"dA": big}, {"dA": base}, "bf16", exact=True)["verdict"] == "fail"
    # the same 2% in a block of 3 effective elements is within rounding noise; over 3,000 it is not
    few = dict(big, scale=0.0, block_scale=0.02, block_scale_neff=3.0, rel_l2=0.01)
    many = dict(few, block_scale_neff=3000.0)
    assert judge({"dv": few}, {"dv": dict(base, rel_l2=0.01)}, "bf16", exact=True)["verdict"] == "pass"
    assert judge({"dv": many}, {"dv": dict(base, rel_l2=0.01)}, "bf16", exact=True)["verdict"] == "fail"

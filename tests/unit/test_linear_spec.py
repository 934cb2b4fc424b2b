"""A recurrence case (``attnbench.linear.spec``), its seeded inputs (gates that matter, packed varlen) and its
FLOP and byte conventions."""

import dataclasses
import math

import pytest
import torch

from attnbench.linear import metrics
from attnbench.linear.inputs import make_inputs, pad_sequences, unpad_sequences
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec


# ---- the spec -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "message"), [
    (dict(heads_qk=4, heads_v=6), r"value heads \(6\) must be a multiple of q/k heads \(4\)"),
    (dict(kind="mamba3"), "unknown recurrence kind 'mamba3'; allowed: gdn, kda, mamba2, linear"),
    (dict(decode=True, seqlens=(5,)), "decode takes one new token per sequence"),
    (dict(decode=True, initial_state=False), "decode continues from a state"),
    (dict(kind="mamba2", l2norm=True), "mamba2 uses its B and C as they are"),
    (dict(kind="kda", gated=False), "kda always has its decay"),
    (dict(kind="gdn", skip=True), "skip .* belongs to mamba2"),
    (dict(dtype="fp8"), "recurrences take fp16, bf16, fp32 or fp64 inputs"),
    (dict(pass_="bwd"), "unknown pass 'bwd' for a recurrence"),
    (dict(seqlens=(3, 0)), "sequence lengths must be positive integers, got 0"),
    (dict(d_k=0), "d_k must be an integer in 1..1024"),
    (dict(chunk=0), "chunk must be a positive integer"),
    (dict(scale=-1.0), "scale must be positive"),
])
def test_bad_cases_are_one_line_errors(fields, message):
    with pytest.raises(ValueError, match=message) as err:
        RecurrenceSpec(**fields)
    assert "\n" not in str(err.value)


def test_defaults_follow_the_kind_and_the_decode_flag():
    gdn, mamba = RecurrenceSpec(kind="gdn"), RecurrenceSpec(kind="mamba2")
    assert gdn.l2norm and not mamba.l2norm  # as the layers call the kernels
    assert gdn.qk_scale == pytest.approx(128 ** -0.5) and mamba.qk_scale == 1.0
    assert gdn.heads_v == 16 and gdn.d_v == 128 and not gdn.initial_state
    step = RecurrenceSpec(decode=True, batch=5)
    assert step.seqlens == (1,) and step.initial_state and step.sequences == (1,) * 5
    assert RecurrenceSpec(kind="kda").input_names == ("q", "k", "v", "g", "beta")
    assert RecurrenceSpec(kind="mamba2", skip=True, initial_state=True).input_names == (
        "q", "k", "v", "dt", "A", "D", "initial_state")
    assert RecurrenceSpec(kind="linear", gated=False).input_names == ("q", "k", "v")


def test_labels_name_what_differs():
    assert RecurrenceSpec(kind="gdn", batch=2, seqlens=(4096,), heads_qk=16, heads_v=32).label() == (
        "gdn b2 s4096 h16/32 k128 v128 bf16 l2")
    varlen = RecurrenceSpec(kind="kda", seqlens=(13, 5), heads_qk=3, heads_v=6, d_k=5, d_v=7, dtype="fp32",
                            pass_="fwd_bwd", initial_state=True, chunk=32)
    assert varlen.label() == "kda b1 varlen[13,5] h3/6 k5 v7 fp32 h0 l2 c32"
    assert RecurrenceSpec(kind="mamba2", decode=True, skip=True).label() == "mamba2 b1 s1 h16 k128 v128 bf16 decode D"
    assert RecurrenceSpec(kind="linear", gated=False).label().startswith("linear-ungated ")


# ---- the inputs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2", "linear"])
def test_inputs_have_fla_layouts_and_dtypes(kind):
    spec = RecurrenceSpec(kind=kind, batch=2, seqlens=(13,), heads_qk=3, heads_v=6, d_k=5, d_v=7,
                          initial_state=True, skip=kind == "mamba2")
    t = make_inputs(spec, seed=11)
    assert t.q.shape == t.k.shape == (2, 13, 3, 5) and t.v.shape == t.dout.shape == (2, 13, 6, 7)
    assert t.q.dtype == t.v.dtype == torch.bfloat16
    assert t.initial_state.shape == t.dfinal_state.shape == (2, 6, 5, 7)
    assert t.initial_state.dtype == torch.float32
    if kind == "mamba2":
        assert t.dt.shape == (2, 13, 6) and bool((t.dt > 0).all())
        assert t.A.shape == t.D.shape == (6,) and bool((t.A < 0).all()) and t.g is None
    else:
        assert t.g.shape == ((2, 13, 6, 5) if kind == "kda" else (2, 13, 6)) and t.g.dtype == torch.float32
        assert bool((t.g < 0).all())
    assert (t.beta is not None) == (kind in ("gdn", "kda"))
    again = make_inputs(spec, seed=11)
    assert torch.equal(t.q, again.q) and torch.equal(t.initial_state, again.initial_state)
    assert not torch.equal(t.q, make_inputs(spec, seed=12).q)


@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2", "linear"])
def test_decays_are_neither_one_nor_zero_everywhere(kind):
    spec = RecurrenceSpec(kind=kind, seqlens=(4001,), heads_qk=2, heads_v=6, d_k=8, d_v=4)
    t = make_inputs(spec)
    decay = torch.exp(t.A * t.dt if kind == "mamba2" else t.g).double().flatten()
    lo, mid, hi = torch.quantile(decay[:200000], torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
    assert 0.8 < mid < 0.98  # a typical token is forgotten over tens of tokens
    assert hi > 0.985 and lo < (0.92 if kind == "linear" else 0.7)  # long and short memories both present
    if t.beta is not None:
        assert 0.4 < float(t.beta.float().median()) < 0.6 and float(t.beta.float().min()) > 0.01


@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2", "linear"])
def test_each_gate_changes_the_output_far_past_bf16_rounding(kind):
    spec = RecurrenceSpec(kind=kind, batch=2, seqlens=(29,), heads_qk=3, heads_v=6, d_k=16, d_v=12,
                          initial_state=True, dtype="fp32")
    t = make_inputs(spec)
    base = reference(spec, t).out
    changes = {"initial_state": torch.zeros_like(t.initial_state)}
    if kind == "mamba2":
        changes["A"] = torch.zeros_like(t.A)  # no decay
    else:
        changes["g"] = torch.zeros_like(t.g)
    if spec.delta:
        changes["beta"] = torch.ones_like(t.beta)
    for name, value in changes.items():
        moved = reference(spec, dataclasses.replace(t, **{name: value})).out
        assert float((moved - base).norm() / base.norm()) > 0.05, name  # bf16 rounding is 0.002


def test_varlen_inputs_pack_and_pad_back():
    spec = RecurrenceSpec(kind="gdn", batch=2, seqlens=(3, 7, 1), heads_qk=1, heads_v=2, d_k=4, d_v=3)
    t = make_inputs(spec)
    assert t.q.shape == (1, 22, 1, 4) and t.cu_seqlens.dtype == torch.int64
    assert t.cu_seqlens.tolist() == [0, 3, 10, 11, 14, 21, 22]
    padded = pad_sequences(spec, t.v)
    assert padded.shape == (6, 7, 2, 3)
    assert torch.equal(padded[1], t.v[0, 3:10]) and bool((padded[0, 3:] == 0).all())
    assert torch.equal(unpad_sequences(spec, padded), t.v)


# ---- FLOPs and bytes ----------------------------------------------------------------------------------
def test_recurrent_flops_count_each_state_operation():
    spec = RecurrenceSpec(kind="gdn", batch=3, seqlens=(7,), heads_qk=2, heads_v=4, d_k=5, d_v=3)
    assert metrics.flops(spec, "recurrent") == 3 * 7 * 4 * 7 * 5 * 3  # decay 1, delta read 2, update 2, read 2
    assert metrics.flops(spec.replace(kind="linear"), "recurrent") == 3 * 7 * 4 * 5 * 5 * 3
    assert metrics.flops(spec.replace(pass_="fwd_bwd"), "recurrent") == 3 * metrics.flops(spec, "recurrent")


def test_chunked_flops_count_the_kept_pairs_of_each_chunk():
    k, v = 5, 3
    spec = RecurrenceSpec(kind="linear", seqlens=(10,), heads_qk=1, d_k=k, d_v=v, chunk=4)

    def linear_chunk(c):
        return c * (c + 1) // 2 * 2 * (k + v) + 4 * c * k * v + k * v
    assert metrics.flops(spec) == 2 * linear_chunk(4) + linear_chunk(2)  # chunks of 4, 4 and 2
    gdn = spec.replace(kind="gdn")
    delta = lambda c: c * (c - 1) // 2 * (2 * k + 2 * (k + v)) + 2 * c * k * v  # noqa: E731
    assert metrics.flops(gdn) == 2 * (linear_chunk(4) + delta(4)) + linear_chunk(2) + delta(2)
    with pytest.raises(ValueError, match="unknown recurrence form"):
        metrics.flops(spec, "parallel")


def test_bytes_count_each_tensor_once_at_its_size():
    spec = RecurrenceSpec(kind="gdn", batch=2, seqlens=(9,), heads_qk=3, heads_v=6, d_k=5, d_v=7,
                          initial_state=True)
    t = make_inputs(spec)
    read = sum(t.tensor(n).numel() * t.tensor(n).element_size() for n in spec.input_names)
    written = t.dout.numel() * 2 + t.dfinal_state.numel() * 4  # out (bf16) and the final state (fp32)
    assert metrics.bytes_moved(spec) == read + written
    assert metrics.bytes_moved(spec.replace(pass_="fwd_bwd")) == (read + written) * 2 + read
    assert metrics.state_bytes(spec) == 2 * 2 * 6 * 5 * 7 * 4
    assert math.isclose(metrics.bytes_moved(spec.replace(kind="kda")) - metrics.bytes_moved(spec),
                        2 * 9 * 6 * 4 * 4)  # KDA's gate has d_k values a token and head

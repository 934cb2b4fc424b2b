"""The PyTorch forms (token loop, chunks) against the exact reference, and the accuracy check failing kernels
that get the recurrence wrong in bf16: the decay after the update, beta ignored, the state not carried across
chunks, value heads reading the wrong q/k head, the final state not returned."""

import dataclasses

import pytest
import torch
from linear_helpers import MISTAKES, as_kernel, rel_l2, verdict, written_out

from attnbench.linear import fla
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec
from attnbench.linear.torch_forms import chunked, naive_recurrent

KINDS = {
    "gdn": dict(kind="gdn"),
    "kda": dict(kind="kda"),
    "mamba2": dict(kind="mamba2", skip=True),
    "linear": dict(kind="linear"),
}


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("form", [naive_recurrent, chunked])
def test_torch_forms_match_the_reference_in_fp32(name, form):
    """Varlen, an initial state, chunks of 4 over sequences of 13 and 6 tokens (a partial last chunk)."""
    spec = RecurrenceSpec(**KINDS[name], batch=2, seqlens=(13, 6), heads_qk=3, heads_v=6, d_k=5, d_v=7,
                          dtype="fp32", initial_state=True, pass_="fwd_bwd", chunk=4)
    inputs = make_inputs(spec, seed=7)
    ref, got = reference(spec, inputs), form(spec, inputs)
    assert set(got) == set(ref)
    for key in ref:
        assert got[key].dtype == torch.float32 and got[key].shape == ref[key].shape, key
        assert rel_l2(got[key], ref[key]) < 2e-6, key


@pytest.mark.parametrize("name", list(KINDS))
def test_the_chunk_form_is_exact_in_fp64(name):
    spec = RecurrenceSpec(**KINDS[name], batch=1, seqlens=(23,), heads_qk=1, heads_v=3, d_k=5, d_v=7,
                          dtype="fp64", initial_state=True, pass_="fwd_bwd", chunk=8)
    inputs = make_inputs(spec, seed=8)
    ref, got = reference(spec, inputs), chunked(spec, inputs)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=1e-10, atol=1e-11, msg=key)


# ---- the check fails kernels that get the recurrence wrong ----------------------------------------------
@pytest.fixture(scope="module")
def bf16_cases():
    """Per kind: spec, inputs, the exact reference and the bf16 token-loop baseline (computed once)."""
    cases = {}
    for name, kind in KINDS.items():
        spec = RecurrenceSpec(**kind, batch=2, seqlens=(37,), heads_qk=3, heads_v=6, d_k=16, d_v=12,
                              dtype="bf16", initial_state=True, pass_="fwd_bwd", chunk=16)
        inputs = make_inputs(spec)
        cases[name] = (spec, inputs, reference(spec, inputs), naive_recurrent(spec, inputs))
    return cases


@pytest.mark.parametrize("name", list(KINDS))
def test_a_correct_kernel_passes_the_check(name, bf16_cases):
    """The recurrence in fp32 with its results rounded to the kernel's dtypes, as a fused kernel returns them."""
    spec, inputs, ref, base = bf16_cases[name]
    right = as_kernel(written_out(spec, inputs, dtype=torch.float32), spec, inputs)
    result = verdict(right, ref, base, spec.dtype)
    assert result["verdict"] == "pass", result.get("reason")


@pytest.mark.parametrize(("name", "mistake"), [(name, mistake) for name in KINDS for mistake in MISTAKES
                                                if mistake != "no-beta" or name in ("gdn", "kda")])
def test_the_check_fails_a_kernel_that_gets_the_recurrence_wrong(name, mistake, bf16_cases):
    spec, inputs, ref, base = bf16_cases[name]
    wrong = as_kernel(written_out(spec, inputs, mistake=mistake, dtype=torch.float32), spec, inputs)
    result = verdict(wrong, ref, base, spec.dtype)
    assert result["verdict"] == "fail", result
    assert rel_l2(wrong.out, ref.out) > 5 * rel_l2(base.out, ref.out)  # far past the bf16 baseline's error


@pytest.mark.parametrize("name", list(KINDS))
def test_the_check_fails_a_kernel_that_drops_the_final_state(name, bf16_cases):
    spec, inputs, ref, base = bf16_cases[name]
    right = as_kernel(written_out(spec, inputs, dtype=torch.float32), spec, inputs)
    result = verdict(right.replace(final_state=None), ref, base, spec.dtype)
    assert result["verdict"] == "fail" and "final_state: not returned" in result["reason"]


def test_the_bf16_baseline_is_the_recurrence_in_bf16(bf16_cases):
    """The yardstick is plain bf16 math: its error is bf16-sized, neither exact nor broken."""
    spec, inputs, ref, base = bf16_cases["gdn"]
    assert base.out.dtype == torch.bfloat16
    assert 1e-3 < rel_l2(base.out, ref.out) < 5e-2


# ---- inputs that do not fit the case ----------------------------------------------------------------------
@pytest.mark.parametrize("form", [reference, naive_recurrent, chunked])
def test_a_state_of_the_wrong_shape_is_one_line_error(form):
    spec = RecurrenceSpec(kind="gdn", seqlens=(9,), batch=2, heads_qk=3, heads_v=6, d_k=5, d_v=7,
                          initial_state=True)
    inputs = make_inputs(spec)
    bad = dataclasses.replace(inputs, initial_state=inputs.initial_state.transpose(-1, -2))
    with pytest.raises(ValueError, match=r"initial_state has shape \(2, 6, 7, 5\) but the case needs "
                                         r"\(2, 6, 5, 7\)") as err:
        form(spec, bad)
    assert "\n" not in str(err.value)


def test_inputs_of_another_case_are_refused():
    spec = RecurrenceSpec(kind="kda", seqlens=(4, 5), heads_qk=2, d_k=3, d_v=3)
    other = make_inputs(spec.replace(seqlens=(5, 4)))
    with pytest.raises(ValueError, match=r"cu_seqlens is \[0, 5, 9\] but the case's sequences need \[0, 4, 9\]"):
        reference(spec, other)
    no_gate = dataclasses.replace(make_inputs(spec), g=None)
    with pytest.raises(ValueError, match="the case needs g"):
        chunked(spec, no_gate)


# ---- fla's kernels: what runs where ---------------------------------------------------------------------
def test_fla_refuses_what_it_cannot_run():
    assert "no backward" in fla.supports(RecurrenceSpec(kind="gdn", pass_="fwd_bwd"), "recurrent")
    assert "no backward" in fla.supports(RecurrenceSpec(kind="kda", pass_="fwd_bwd"), "recurrent")
    assert "chunk sizes (32, 64)" in fla.supports(RecurrenceSpec(kind="kda", chunk=16))
    assert "d_k up to 256" in fla.supports(RecurrenceSpec(kind="kda", d_k=320))
    assert "power-of-two" in fla.supports(RecurrenceSpec(kind="linear", chunk=48))
    with pytest.raises(ValueError, match="unknown fla op"):
        fla.supports(RecurrenceSpec(), "parallel")
    if not torch.cuda.is_available():
        spec = RecurrenceSpec(kind="gdn", seqlens=(8,), heads_qk=1, d_k=4)
        assert fla.supports(spec) == "fla's Triton kernels need a GPU"
        with pytest.raises(ValueError, match="need a GPU"):
            fla.prepare(spec, make_inputs(spec))

"""The exact recurrence (``attnbench.linear.reference``) against the recurrence written out token by token in
fp64 for every kind, a state handed over between two calls, varlen sequences each on its own, a decode step,
and its gradients against finite differences."""

import dataclasses

import pytest
import torch
from linear_helpers import written_out

from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec

ODD = dict(heads_qk=3, heads_v=6, d_k=5, d_v=7, dtype="fp64")
KINDS = {
    "gdn": dict(kind="gdn"),
    "deltanet": dict(kind="gdn", gated=False),
    "kda": dict(kind="kda"),
    "mamba2-skip": dict(kind="mamba2", skip=True),
    "linear": dict(kind="linear"),
    "linear-ungated-l2": dict(kind="linear", gated=False, l2norm=True),
}


def case(name, **more):
    return RecurrenceSpec(**{**ODD, **KINDS[name], **more})


def assert_same(got, want, names=None, tol=1e-12):
    names = names or list(want)
    assert set(names) <= set(got)
    for name in names:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=tol * max(1.0, want[name].abs().max()),
                                   msg=name)


@pytest.mark.parametrize("name", list(KINDS))
def test_reference_is_the_recurrence_written_out(name):
    spec = case(name, batch=2, seqlens=(13,), initial_state=True, pass_="fwd_bwd")
    inputs = make_inputs(spec, seed=3)
    ref = reference(spec, inputs, block=4)
    want = written_out(spec, inputs)
    assert set(ref) == {"out", "final_state", *(f"d{n}" for n in spec.input_names)}
    assert_same(ref, want)
    assert ref.out.shape == (2, 13, 6, 7) and ref.final_state.shape == (2, 6, 5, 7)


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2-skip", "linear"])
def test_a_state_handed_over_continues_the_sequence(name):
    """Prefill 13 tokens in two calls (6, then 7 from the first call's final state) = one call of 13."""
    spec = case(name, batch=2, seqlens=(13,), initial_state=True)
    inputs = make_inputs(spec, seed=1)
    whole = reference(spec, inputs)
    first_spec, second_spec = spec.replace(seqlens=(6,)), spec.replace(seqlens=(7,))
    first = reference(first_spec, _tokens(first_spec, inputs, 0, 6, inputs.initial_state))
    second = reference(second_spec, _tokens(second_spec, inputs, 6, 13, first.final_state))
    torch.testing.assert_close(torch.cat([first.out, second.out], 1), whole.out, rtol=0, atol=1e-12)
    torch.testing.assert_close(second.final_state, whole.final_state, rtol=0, atol=1e-12)
    moved = (first.final_state - inputs.initial_state.double()).norm() / inputs.initial_state.double().norm()
    assert moved > 0.1  # the handed-over state is not the one it started from


def _tokens(spec, inputs, a, b, state):
    """Inputs of tokens a..b of a dense case, starting from ``state``."""
    per_token = {"q", "k", "v", "dout", "g", "beta", "dt", "a"}
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    for name in per_token:
        if fields.get(name) is not None:
            fields[name] = fields[name][:, a:b]
    fields["initial_state"] = state  # kept in fp64 when it comes from the reference
    return type(inputs)(**fields)


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2-skip", "linear"])
def test_varlen_sequences_each_keep_their_own_state(name):
    spec = case(name, batch=2, seqlens=(5, 13, 1), initial_state=True, pass_="fwd_bwd")
    inputs = make_inputs(spec, seed=2)
    assert inputs.q.shape[:2] == (1, 38) and inputs.cu_seqlens.tolist() == [0, 5, 18, 19, 24, 37, 38]
    ref = reference(spec, inputs)
    cu = inputs.cu_seqlens.tolist()
    for n in range(spec.num_seqs):
        a, b = cu[n], cu[n + 1]
        one = spec.replace(seqlens=(b - a,), batch=1)
        fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        for key in ("q", "k", "v", "dout", "g", "beta", "dt"):
            if fields.get(key) is not None:
                fields[key] = fields[key][:, a:b]
        fields.update(initial_state=inputs.initial_state[n:n + 1], dfinal_state=inputs.dfinal_state[n:n + 1],
                      cu_seqlens=None)
        alone = reference(one, type(inputs)(**fields))
        torch.testing.assert_close(ref.out[:, a:b], alone.out, rtol=0, atol=1e-12)
        torch.testing.assert_close(ref.final_state[n:n + 1], alone.final_state, rtol=0, atol=1e-12)
        for key in ("dq", "dk", "dv"):
            torch.testing.assert_close(ref[key][:, a:b], alone[key], rtol=0, atol=1e-12, msg=key)
        torch.testing.assert_close(ref.dinitial_state[n:n + 1], alone.dinitial_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2-skip", "linear"])
def test_decode_is_one_step_from_the_state_handed_in(name):
    """A decode step after a 12-token prefill gives the 13th token and state of the 13-token prefill."""
    spec = case(name, batch=3, seqlens=(13,), initial_state=True)
    inputs = make_inputs(spec, seed=4)
    whole = reference(spec, inputs)
    prefill_spec = spec.replace(seqlens=(12,))
    prefill = reference(prefill_spec, _tokens(prefill_spec, inputs, 0, 12, inputs.initial_state))
    step_spec = spec.replace(seqlens=None, decode=True)
    assert step_spec.seqlens == (1,) and step_spec.initial_state
    step = reference(step_spec, _tokens(step_spec, inputs, 12, 13, prefill.final_state))
    torch.testing.assert_close(step.out, whole.out[:, 12:], rtol=0, atol=1e-12)
    torch.testing.assert_close(step.final_state, whole.final_state, rtol=0, atol=1e-12)
    want = written_out(step_spec, _tokens(step_spec, inputs, 12, 13, prefill.final_state))
    torch.testing.assert_close(step.out, want.out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2-skip", "linear"])
def test_gradients_match_finite_differences(name):
    """<d(name), δ> = (L(x + εδ) − L(x − εδ)) / 2ε for L = <out, dout> + <final_state, dfinal_state>."""
    spec = case(name, batch=1, seqlens=(5,), heads_qk=1, heads_v=2, d_k=3, d_v=2, initial_state=True,
                pass_="fwd_bwd")
    inputs = make_inputs(spec, seed=5)
    grads = reference(spec, inputs, block=2)
    fwd = spec.replace(pass_="fwd")
    gen = torch.Generator().manual_seed(0)

    def loss(changed):
        out = reference(fwd, dataclasses.replace(inputs, **changed))
        return float((out.out * inputs.dout.double()).sum() + (out.final_state * inputs.dfinal_state.double()).sum())

    eps = 1e-6
    for key in spec.input_names:
        x = inputs.tensor(key).double()
        direction = torch.randn(x.shape, generator=gen, dtype=torch.float64)
        numeric = (loss({key: x + eps * direction}) - loss({key: x - eps * direction})) / (2 * eps)
        analytic = float((grads[f"d{key}"] * direction).sum())
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8), key
        assert abs(analytic) > 1e-3, key  # the direction moves the loss: the comparison means something


def test_checkpoint_blocks_do_not_change_the_result():
    spec = case("kda", batch=2, seqlens=(11,), initial_state=True, pass_="fwd_bwd")
    inputs = make_inputs(spec)
    one, many = reference(spec, inputs, block=1), reference(spec, inputs, block=11)
    assert_same(one, many, tol=1e-13)

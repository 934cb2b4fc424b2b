"""fla-core's recurrence kernels on the GPU against the exact reference: chunk and fused-recurrent GDN, KDA,
simple GLA and Mamba2 (through simple GLA), dense and varlen, with a state in and out, forward and backward,
held by the accuracy check to twice the error of the bf16 token loop (skipped where fla is not installed)."""

from __future__ import annotations

import pytest

from attnbench.accuracy.compare import compare
from attnbench.accuracy.tolerance import judge
from attnbench.linear import fla
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec
from attnbench.linear.torch_forms import naive_recurrent

pytestmark = pytest.mark.gpu

SHAPE = dict(heads_qk=4, heads_v=8, d_k=64, d_v=64)
CASES = [
    ("chunk", dict(kind="gdn", batch=2, seqlens=(300,), initial_state=True)),  # forward: runs on any Triton
    ("chunk", dict(kind="kda", seqlens=(77, 200, 13), initial_state=True)),
    ("chunk", dict(kind="gdn", batch=2, seqlens=(300,), initial_state=True, pass_="fwd_bwd")),
    ("chunk", dict(kind="gdn", seqlens=(77, 200, 13), initial_state=True, pass_="fwd_bwd")),
    ("chunk", dict(kind="gdn", gated=False, batch=2, seqlens=(150,), pass_="fwd_bwd")),
    ("recurrent", dict(kind="gdn", batch=2, seqlens=(300,), initial_state=True)),
    ("recurrent", dict(kind="gdn", decode=True, batch=5)),
    ("chunk", dict(kind="kda", batch=2, seqlens=(300,), initial_state=True, pass_="fwd_bwd")),
    ("chunk", dict(kind="kda", seqlens=(77, 200, 13), initial_state=True, pass_="fwd_bwd")),
    ("recurrent", dict(kind="kda", batch=2, seqlens=(300,), initial_state=True)),
    ("recurrent", dict(kind="kda", decode=True, batch=5)),
    ("chunk", dict(kind="linear", batch=2, seqlens=(300,), initial_state=True, pass_="fwd_bwd")),
    ("recurrent", dict(kind="linear", seqlens=(77, 200, 13), initial_state=True, pass_="fwd_bwd")),
    ("chunk", dict(kind="mamba2", skip=True, batch=2, seqlens=(300,), initial_state=True, pass_="fwd_bwd")),
    ("recurrent", dict(kind="mamba2", skip=True, decode=True, batch=5)),
]


@pytest.mark.parametrize(("op", "fields"), CASES, ids=[f"{op}-{RecurrenceSpec(**SHAPE, **f).label()}"
                                                       for op, f in CASES])
def test_fla_kernels_pass_the_check(op, fields):
    pytest.importorskip("fla.ops")
    spec = RecurrenceSpec(**SHAPE, **fields)
    inputs = make_inputs(spec, device="cuda")
    if (why := fla.supports(spec, op)) is not None:
        assert "backward" in why  # only fla's own refusal of its backward here (Triton on Hopper)
        pytest.skip(why)
    got = fla.prepare(spec, inputs, op)()
    ref = reference(spec, inputs)
    assert set(got) == set(ref)
    base = compare(naive_recurrent(spec, inputs).tensors(), ref.tensors())
    result = judge(compare(got.tensors(), ref.tensors()), base, spec.dtype, exact=True)
    assert result["verdict"] == "pass", result.get("reason")

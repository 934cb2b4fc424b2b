"""cuDNN frontend's KDA (its sm90 engines) on the GPU against the exact reference: forward dense and varlen, with
grouped value heads, a state in and out, q and k normalised in the op or before it, each engine pinned and cuDNN's
own choice; the backward where its one sm90 engine takes it. Held by the accuracy check to twice the error of the
bf16 token loop (skipped where the package does not import or the GPU is not an sm90)."""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.compare import compare
from attnbench.accuracy.tolerance import judge
from attnbench.linear import cudnn_kda
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec
from attnbench.linear.torch_forms import naive_recurrent

pytestmark = pytest.mark.gpu

SHAPE = dict(kind="kda", heads_qk=2, heads_v=2, d_k=128, d_v=128, dtype="bf16", initial_state=True)
CASES = [
    ("auto", dict(batch=2, seqlens=(300,))),
    ("auto", dict(seqlens=(77, 200, 13), heads_v=4)),
    ("kda_hopper_cuda", dict(seqlens=(77, 200, 13))),
    ("kda_hopper", dict(batch=2, seqlens=(300,), l2norm=False)),  # its scope: q, k normalised before the call
    ("auto", dict(batch=2, seqlens=(300,), l2norm=False, pass_="fwd_bwd")),
    ("auto", dict(seqlens=(77, 200, 13), l2norm=False, pass_="fwd_bwd")),
]


@pytest.mark.parametrize(("plan", "fields"), CASES,
                         ids=[f"{plan}-{RecurrenceSpec(**{**SHAPE, **f}).label()}-{f.get('pass_', 'fwd')}"
                              for plan, f in CASES])
def test_cudnn_kda_passes_the_check(plan, fields):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if (why := cudnn_kda.arch_reason(torch.cuda.get_device_capability())) is not None:
        pytest.skip(why)
    pytest.importorskip("cudnn.linear_attention")
    spec = RecurrenceSpec(**{**SHAPE, **fields})
    inputs = make_inputs(spec, device="cuda")
    got = cudnn_kda.prepare(spec, inputs, plan)()
    ref = reference(spec, inputs)
    assert set(got) == set(ref)
    base = compare(naive_recurrent(spec, inputs).tensors(), ref.tensors())
    result = judge(compare(got.tensors(), ref.tensors()), base, spec.dtype, exact=True)
    assert result["verdict"] == "pass", result.get("reason")

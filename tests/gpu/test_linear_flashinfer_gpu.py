"""FlashInfer's Gated DeltaNet kernels on the GPU against the exact reference: the chunked prefill (dense and
varlen, a state in and out, FlashInfer's context-parallel routing forced on and off) and the single-token decode,
held by the accuracy check to twice the error of the bf16 token loop (skipped where FlashInfer's GDN modules or
their CuTe DSL are not installed)."""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.compare import compare
from attnbench.accuracy.tolerance import judge
from attnbench.linear import flashinfer as fi
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import reference
from attnbench.linear.spec import RecurrenceSpec
from attnbench.linear.torch_forms import naive_recurrent

pytestmark = pytest.mark.gpu

SHAPE = dict(kind="gdn", heads_qk=2, heads_v=4, d_k=128, d_v=128, dtype="bf16")
CASES = [
    ("prefill", "auto", dict(batch=2, seqlens=(300,), initial_state=True)),
    ("prefill", "never", dict(seqlens=(77, 200, 13), initial_state=True)),
    ("prefill", "always", dict(seqlens=(77, 200, 13), initial_state=True)),
    ("prefill", "auto", dict(gated=False, batch=2, seqlens=(150,))),
    ("decode", "auto", dict(decode=True, batch=5)),
    ("decode", "auto", dict(decode=True, batch=40)),  # FlashInfer's big-batch decode kernel (32 and over)
]


@pytest.mark.parametrize(("op", "use_cp", "fields"), CASES,
                         ids=[f"{op}-{cp}-{RecurrenceSpec(**SHAPE, **f).label()}" for op, cp, f in CASES])
def test_flashinfer_gdn_passes_the_check(op, use_cp, fields):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if (why := fi.kernel_reason(op, torch.cuda.get_device_capability()[0])) is not None:
        pytest.skip(why)
    spec = RecurrenceSpec(**SHAPE, **fields)
    inputs = make_inputs(spec, device="cuda")
    call = fi.prepare(spec, inputs, op, **({"use_cp": use_cp} if op == "prefill" else {}))
    got = call()
    if (finish := fi.finish(op)) is not None:
        got = finish(got)
    ref = reference(spec, inputs)
    assert set(got) == set(ref)
    base = compare(naive_recurrent(spec, inputs).tensors(), ref.tensors())
    result = judge(compare(got.tensors(), ref.tensors()), base, spec.dtype, exact=True)
    assert result["verdict"] == "pass", result.get("reason")

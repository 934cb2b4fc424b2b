"""The variants' wrong kernels (``tests/unit/test_variants.py``: a sink ignored or in the numerator, the softcap
before the scale or its derivative dropped, ALiBi reversed, symmetric or missing from the backward, d(sinks) not
returned) fail the check on the GPU too, in bf16 and fp32, at S = 4000 with GQA, where the right kernel passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_variants import MISTAKES, Mistaken  # noqa: E402

from attnbench.accuracy.check import AccuracyChecker  # noqa: E402
from attnbench.backends.naive import NaiveBackend  # noqa: E402
from attnbench.features.alibi import alibi_slopes  # noqa: E402
from attnbench.inputs import make_inputs  # noqa: E402
from attnbench.spec import AttnSpec  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("mistake", list(MISTAKES))
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_each_variant_mistake_fails_on_the_gpu(mistake, dtype):
    fields = dict(MISTAKES[mistake])
    if "alibi" in fields:
        fields["alibi"] = alibi_slopes(8)
    spec = AttnSpec(batch=1, seqlens_q=(4000,), heads_q=8, heads_kv=2, head_dim=64, dtype=dtype, pass_="fwd_bwd",
                    **fields)
    inputs = make_inputs(spec, "cuda")
    checker = AccuracyChecker()
    right = checker(spec, inputs, NaiveBackend().prepare(spec, inputs).fn(), NaiveBackend())
    assert right["verdict"] == "pass", right.get("reason")
    kind = mistake.partition(" ")[0]
    wrong = checker(spec, inputs, Mistaken(kind).prepare(spec, inputs).fn(), Mistaken(kind))
    assert wrong["verdict"] == "fail", (mistake, wrong.get("worst"))

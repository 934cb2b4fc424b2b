"""The verdict catches 1% systematic errors and passes correct kernels (the two directions of the rule).

Wrong-on-purpose kernels (tests/plugins): an fp32-accumulating kernel with one tensor 1% off, its LSE
shifted by 0.01, its softmax scale 1% off, or dV 3% off in one tile of 128 keys. Correct kernels: the
same fp32 kernel unspoiled, naive math, SDPA's math and CPU flash kernels.
"""

import sys

import pytest
import torch
from reliability_helpers import PLUGINS

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

sys.path.insert(0, PLUGINS)
import attnbench_test_backends as plugins  # noqa: E402  (registers the test backends)

SHAPES = {
    "S100": dict(seqlens_q=(100,), heads_q=4, heads_kv=2, head_dim=64),
    "S1000-gqa": dict(seqlens_q=(1000,), heads_q=4, heads_kv=2, head_dim=64),
    "varlen": dict(seqlens_q=(77, 300, 1), heads_q=4, heads_kv=2, head_dim=64),
}
CORRECT = ("test-fp32", "naive", "sdpa-math", "sdpa-flash")
WRONG = tuple(cls.name for cls in plugins.WRONG)
CHECKER = AccuracyChecker(cache_size=1)


def verdicts(spec: AttnSpec, names, seed: int = 0) -> dict[str, dict]:
    inputs = make_inputs(spec, torch.device("cpu"), seed)
    result = {}
    for name in names:
        backend = registry.get(name)
        if backend.supports(spec, torch.device("cpu")):
            continue
        result[name] = CHECKER(spec, inputs, backend.prepare(spec, inputs).fn(), backend)
    return result


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_percent_systematic_errors_fail_and_correct_kernels_pass(dtype, shape, causal):
    spec = AttnSpec(dtype=dtype, causal=causal, pass_="fwd_bwd", **SHAPES[shape])
    got = verdicts(spec, CORRECT + WRONG)
    for name in CORRECT:
        if name in got:
            acc = got[name]
            assert acc["verdict"] == "pass", (name, acc.get("reason"))
            assert systematic_ratio(acc) < 0.5, name  # far below: rounding has no preferred direction
    for name in WRONG:
        acc = got[name]
        assert acc["verdict"] == "fail", (name, dtype, shape, causal, acc["worst"])
    assert "test-fp32" in got and "naive" in got


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_only_a_wrong_scale_shows_in_the_output_alone(dtype, causal):
    spec = AttnSpec(dtype=dtype, causal=causal, pass_="fwd", **SHAPES["S1000-gqa"])
    got = verdicts(spec, ("test-out-x0.99", "test-softmax-scale-nolse", "test-fp32"))
    assert got["test-out-x0.99"]["verdict"] == "fail" and "out scale" in got["test-out-x0.99"]["reason"]
    assert got["test-softmax-scale-nolse"]["verdict"] == "fail"
    assert got["test-fp32"]["verdict"] == "pass"


def systematic_ratio(acc: dict) -> float:
    """Largest |systematic measure| / limit over the tensors."""
    return max(abs(acc["tensors"][t][k]) / lim for t, limits in acc["limits"].items() for k, lim in limits.items()
               if k in ("scale", "bias", "block_scale", "block_bias"))


@pytest.mark.parametrize("seed", [1, 2])
def test_correct_kernels_pass_whatever_the_seed(seed):
    for dtype in ("bf16", "fp16"):
        spec = AttnSpec(dtype=dtype, causal=True, pass_="fwd_bwd", **SHAPES["S1000-gqa"])
        for name, acc in verdicts(spec, CORRECT, seed).items():
            assert acc["verdict"] == "pass", (name, dtype, seed, acc.get("reason"))
            assert acc["worst"]["ratio"] < 0.9, (name, dtype, seed, acc["worst"])

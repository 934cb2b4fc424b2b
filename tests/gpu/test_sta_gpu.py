"""Sliding tile attention on the GPU: fastvideo-kernel's compiled and Triton kernels and FlexAttention with the
STA block mask, each checked against exact attention over the same (query, key) pairs by attnbench's own
accuracy check, on the grids the compiled kernel knows and on one only the Triton kernel takes.

Run on the GPU machine with fastvideo_kernel on PYTHONPATH (docs/backends.md: building sta_fwd):
PYTHONPATH=src:SITE python3 -m pytest -q -m gpu tests/gpu/test_sta_gpu.py -rs
"""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.sta import TileMask
from attnbench.timing import TimingConfig

pytestmark = pytest.mark.gpu


def spec(grid, windows, text=0, heads=2, batch=1):
    tm = TileMask(grid=grid, tile=(6, 8, 8), windows=windows, text=text)
    return AttnSpec(batch=batch, seqlens_q=(tm.tokens,), heads_q=heads, head_dim=128, dtype="bf16", layout="bhsd",
                    sta=tm)


CASES = {
    "18x48x80": spec((18, 48, 80), ((3, 3, 5), (1, 6, 10)), batch=2),
    "36x48x48": spec((36, 48, 48), ((3, 6, 6),)),
    "30x48x80-text": spec((30, 48, 80), ((5, 6, 10), (3, 3, 5)), text=226),
    "12x16x24-text": spec((12, 16, 24), ((1, 1, 3),), text=100),   # Triton and Flex only
}


def run(name: str, case: AttnSpec):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    backend = registry.get(name)
    if (why := backend.unavailable_reason()) is not None:
        pytest.skip(why)
    runner = Runner(RunOptions(device="cuda", backends=(name,), timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="t", env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    return runner.run([case])[0]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["sta", "sta-triton", "flex"])
def test_sta_kernels_match_exact_attention_over_the_same_pairs(name, case):
    rec = run(name, CASES[case])
    if name == "sta" and case == "12x16x24-text":
        assert rec.status == "unsupported" and "knows the grids" in rec.reason
        return
    assert rec.status == "ok", rec.reason
    assert rec.accuracy["verdict"] == "pass", rec.accuracy
    assert rec.info["kept_fraction"] == pytest.approx(CASES[case].sta.kept_fraction(2), abs=1e-6)


def test_a_window_the_compiled_kernel_lacks_is_unsupported_not_a_crash():
    rec = run("sta", spec((18, 48, 80), ((3, 3, 3), (3, 5, 3))))
    assert rec.status == "unsupported" and "3x5x3" in rec.reason

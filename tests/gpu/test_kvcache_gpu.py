"""KV-cache backends on the GPU (flash_attn_with_kvcache of flash-attn 2/3, FlashInfer's paged wrappers):
decode over contiguous and paged caches passes the accuracy check against the exact reference (skipped
where the package is not installed)."""

from __future__ import annotations

import pytest

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

pytestmark = pytest.mark.gpu

CASES = [
    AttnSpec(batch=1, seqlens_q=(1, 1, 1, 1), seqlens_k=(1000, 4096, 300, 8191), heads_q=32, heads_kv=8,
             head_dim=128, dtype="bf16"),
    AttnSpec(batch=3, seqlens_q=(16,), seqlens_k=(4099,), heads_q=16, heads_kv=4, head_dim=64, dtype="bf16",
             causal=True),
]


@pytest.mark.parametrize("name", ["fa2-kvcache", "fa2-paged", "fa3-kvcache", "fa3-paged", "flashinfer-decode",
                                  "flashinfer-paged"])
def test_decode_over_a_cache_passes_the_check(name):
    backend = registry.get(name)
    reason = backend.supports(CASES[0], "cuda")
    if reason:
        pytest.skip(f"{name}: {reason}")
    cases = [c for c in CASES if backend.supports(c, "cuda") is None]  # flashinfer-decode: one query a request
    runner = Runner(RunOptions(device="cuda", backends=(name,), timing=TimingConfig(warmup=2, repeat=5)),
                    run_id="kv", env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    records = runner.run(cases)
    assert [r.status for r in records] == ["ok"] * len(cases), [(r.status, r.reason) for r in records]
    assert all(r.accuracy["verdict"] == "pass" for r in records)

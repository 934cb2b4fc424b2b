"""FP8 inputs on FlashAttention-3 (dense, varlen, KV cache, paged): the kernel with the case's descales
passes the approximate check against the exact attention of the dequantized inputs, and the same call
without the descales fails it (skipped where the installed FA3 build has no fp8)."""

from __future__ import annotations

import pytest

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.backends.kvcache import Fa3Paged
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

pytestmark = pytest.mark.gpu

PREFILL = AttnSpec(batch=2, seqlens_q=(1000,), seqlens_k=(3000,), heads_q=16, heads_kv=4, head_dim=128, dtype="fp8",
                   causal=True)
GROUPED = AttnSpec(batch=1, seqlens_q=(77, 300, 1), seqlens_k=(500, 300, 4000), heads_q=8, heads_kv=8, head_dim=64,
                   dtype="fp8")
DECODE = AttnSpec(batch=1, seqlens_q=(4, 4, 4), seqlens_k=(1000, 8191, 300), heads_q=32, heads_kv=8, head_dim=128,
                  dtype="fp8", causal=True)
CASES = {"fa3": PREFILL, "fa3-varlen": GROUPED, "fa3-kvcache": DECODE, "fa3-paged": DECODE, "fa3-paged-64": DECODE}


def _backend(name):
    return Fa3Paged(page_size=64) if name == "fa3-paged-64" else registry.get(name)


def _run(backend, spec):
    runner = Runner(RunOptions(device="cuda", backends=(backend.name,), timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="fp8", env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    runner.backends = [backend]
    return runner.run([spec])[0]


@pytest.mark.parametrize("dtype", ["fp8", "fp8-head"])
@pytest.mark.parametrize("name", list(CASES))
def test_fp8_passes_against_the_dequantized_inputs(name, dtype):
    backend, spec = _backend(name), CASES[name].replace(dtype=dtype)
    if reason := backend.supports(spec, "cuda"):
        pytest.skip(f"{name}: {reason}")
    record = _run(backend, spec)
    assert record.status == "ok", (record.status, record.reason)
    acc = record.accuracy
    assert acc["verdict"] == "approx-pass", acc.get("reason")
    out, unquantized = acc["tensors"]["out"], acc["unquantized"]["tensors"]["out"]
    assert out["cosine"] > 0.999 and out["rel_l1"] < unquantized["rel_l1"] < 0.07, (out, unquantized)


@pytest.mark.parametrize("name", ["fa3", "fa3-paged"])
def test_without_the_descales_the_kernel_fails_the_check(name, monkeypatch):
    backend, spec = _backend(name), CASES[name]
    if reason := backend.supports(spec, "cuda"):
        pytest.skip(f"{name}: {reason}")
    monkeypatch.setattr("attnbench.backends.fa3.descale_kwargs", lambda inputs, sequences: {})
    monkeypatch.setattr("attnbench.backends.kvcache.descale_kwargs", lambda inputs, sequences: {})
    record = _run(backend, spec)
    assert record.accuracy["verdict"] == "approx-fail", record.accuracy

"""FP8 inputs (``--dtype fp8`` / ``fp8-head``): e4m3 q, k, v with per-tensor or per-KV-head descales, judged
against the exact attention of the dequantized inputs and compared with that of the bf16 inputs; the
FlashAttention-3 adapters hand the descales over as the kernel takes them. On CPU, with stand-ins."""

from __future__ import annotations

import dataclasses
import json

import fake_kernels as fk
import pytest
import torch
from reliability_helpers import attnbench, query

from attnbench import metrics
from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.backends.base import check_capabilities
from attnbench.backends.fa3 import NO_FP8_BACKWARD
from attnbench.backends.kvcache import Fa2KVCache, Fa3KVCache, Fa3Paged
from attnbench.inputs import FP8_MAX, dequantized, make_inputs, quantize
from attnbench.spec import AttnSpec

E4M3 = torch.float8_e4m3fn


def spec_(**kw) -> AttnSpec:
    base = dict(batch=2, seqlens_q=(40,), seqlens_k=(70,), heads_q=6, heads_kv=2, head_dim=64, dtype="fp8")
    return AttnSpec(**(base | kw))


@pytest.mark.parametrize("dtype", ["fp8", "fp8-head"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_fp8_inputs_are_the_bf16_inputs_of_the_seed_quantized(dtype, layout):
    spec = spec_(dtype=dtype, layout=layout)
    got, bf16 = make_inputs(spec, seed=5), make_inputs(spec.replace(dtype="bf16"), seed=5)
    assert got.q.dtype == got.k.dtype == got.v.dtype == E4M3 and got.dout.dtype == torch.bfloat16
    assert got.q.stride() == bf16.q.stride()
    values = dequantized(got, torch.float64)
    for name, descale in zip("qkv", got.descale, strict=True):
        assert descale.shape == (2,) and descale.dtype == torch.float32
        original, stored = getattr(bf16, name).double(), getattr(got, name)
        assert torch.equal(getattr(got.unquantized, name), getattr(bf16, name))
        # round to nearest e4m3: half a step of 3 mantissa bits, or of the subnormal spacing 2^-9
        step = torch.maximum(original.abs() * 2.0 ** -4, descale.max().double() * 2.0 ** -10)
        assert ((getattr(values, name) - original).abs() <= step * 1.0001).all(), name
        groups = stored.float().abs().unflatten(-2, (2, -1)).movedim(-3, 0).reshape(2, -1).amax(1)
        if dtype == "fp8-head":   # each KV head (with its queries) reaches e4m3's largest value
            assert groups.tolist() == [FP8_MAX, FP8_MAX]
        else:                     # one scale: only the tensor's largest element does
            assert groups.max().item() == FP8_MAX and descale[0] == descale[1]


def test_per_head_descales_keep_a_quiet_head_accurate():
    spec = spec_(batch=1, seqlens_q=(64,), seqlens_k=(64,), heads_q=2, dtype="bf16")
    loud = make_inputs(spec, seed=1)
    k = loud.k.clone()
    k[:, :, 1] *= 1e5  # one KV head 10^5 times louder: one shared scale sends the quiet one to e4m3's subnormals
    inputs = dataclasses.replace(loud, k=k)
    errors = {}
    for per_head in (False, True):
        values = dequantized(quantize(inputs, per_head=per_head), torch.float64).k[:, :, 0]
        errors[per_head] = ((values - k[:, :, 0].double()).norm() / k[:, :, 0].double().norm()).item()
    assert errors[True] < 0.04 < 0.1 < errors[False], errors


def test_bytes_count_fp8_inputs_at_one_byte_and_the_bf16_output_at_two():
    spec = AttnSpec(batch=1, seqlens_q=(1,), seqlens_k=(1000,), heads_q=4, heads_kv=1, head_dim=64, dtype="fp8")
    kv, q, out, lse = 2 * 1000 * 64, 4 * 64, 4 * 64 * 2, 4 * 4
    assert metrics.bytes_moved(spec) == kv + q + out + lse
    assert metrics.bytes_moved(spec.replace(dtype="bf16")) == 2 * (kv + q) + out + lse


def test_the_memory_estimate_counts_the_kept_bf16_inputs():
    from attnbench.memory import estimate
    spec = spec_()
    fp8, bf16 = estimate(spec).inputs, estimate(spec.replace(dtype="bf16")).inputs
    elements = 2 * (40 * 6 * 64 + 2 * 70 * 2 * 64)  # q, k, v of both sequences (the bf16 output cancels)
    assert fp8 - bf16 == elements                   # one byte more per element: e4m3 beside the bf16 copy


def test_backends_without_fp8_refuse_it_with_the_reason(fake):
    fake("fa3-trimmed")  # the trimmed build: FLASHATTENTION_DISABLE_FP8
    spec = spec_(pass_="fwd")
    assert "dtype fp8 not supported" in registry.get("naive").supports(spec, "cpu")
    assert "dtype fp8 not supported" in check_capabilities(Fa2KVCache().capabilities, spec, "cuda")
    reason = registry.get("fa3").supports(spec, "cuda")
    assert "in this FlashAttention-3 build" in reason and "FP8" in reason


def test_fa3_with_fp8_takes_it_forward_only(fake):
    fake("fa3")
    spec = spec_(pass_="fwd")
    assert registry.get("fa3").supports(spec, "cuda") is None
    assert registry.get("fa3-varlen").supports(spec_(dtype="fp8-head", seqlens_q=(3, 9), seqlens_k=(5, 9)), "cuda") is None
    assert registry.get("fa3").supports(spec.replace(pass_="fwd_bwd"), "cuda") == NO_FP8_BACKWARD


@pytest.mark.parametrize("dtype", ["fp8", "fp8-head"])
@pytest.mark.parametrize("name, spec", [
    ("fa3", spec_(causal=True)),
    ("fa3-varlen", spec_(batch=2, seqlens_q=(3, 40), seqlens_k=(50, 40), causal=True)),
    ("fa3-varlen", spec_(batch=3)),   # a dense case, flattened
], ids=["fa3", "fa3-varlen", "fa3-varlen-dense"])
def test_fa3_gets_the_descales_per_sequence_and_kv_head_and_passes(fake, name, spec, dtype):
    fake("fa3")
    spec = spec.replace(dtype=dtype)
    inputs = make_inputs(spec, seed=2)
    backend = registry.get(name)
    got = backend.prepare(spec, inputs).fn()
    call = fk.CALLS[-1][1]
    assert call["q"].dtype == E4M3 and got.out.dtype == torch.bfloat16
    for which, descale in zip("qkv", inputs.descale, strict=True):
        sent = call[f"{which}_descale"]
        assert sent.shape == (len(spec.sequences), 2) and torch.equal(sent, descale.expand(len(spec.sequences), 2))
    acc = AccuracyChecker()(spec, inputs, got, backend)
    assert acc["verdict"] == "approx-pass" and "dequantized" in acc["reference"]
    # the stand-in is exact on the dequantized inputs: only the bf16 output rounding is left...
    assert acc["tensors"]["out"]["cosine"] > 0.9999
    # ...while against the bf16 inputs the quantization shows, by e4m3's rounding (2^-4 relative)
    unq = acc["unquantized"]["tensors"]["out"]
    assert 2 * acc["tensors"]["out"]["rel_l1"] < unq["rel_l1"] < 0.07


def test_a_kernel_that_ignores_the_descales_fails(fake, monkeypatch):
    fake("fa3")
    spec = spec_()
    inputs = make_inputs(spec, seed=2)
    monkeypatch.setattr("attnbench.backends.fa3.descale_kwargs", lambda inputs, sequences: {})
    backend = registry.get("fa3")
    acc = AccuracyChecker()(spec, inputs, backend.prepare(spec, inputs).fn(), backend)
    assert acc["verdict"] == "approx-fail" and "out" in acc["reason"]


@pytest.mark.parametrize("backend", [Fa3KVCache(), Fa3Paged(page_size=16), Fa3Paged(page_size=64)],
                         ids=lambda b: f"{b.name}-{b.page_size}")
def test_fp8_decode_over_a_cache_reads_the_dequantized_cache(fake, monkeypatch, backend):
    import sys

    from test_kvcache import CALLS, with_kvcache
    fake("fa3")
    monkeypatch.setattr(sys.modules["flash_attn_interface"], "flash_attn_with_kvcache", with_kvcache, raising=False)
    spec = AttnSpec(batch=1, seqlens_q=(2, 2, 2), seqlens_k=(17, 130, 64), heads_q=8, heads_kv=2, head_dim=64,
                    dtype="fp8-head", causal=True)
    inputs = make_inputs(spec, seed=4)
    got = backend.prepare(spec, inputs).fn()
    assert CALLS[-1]["descales"] == [(3, 2)] * 3 and CALLS[-1]["cache_dtype"] == E4M3  # the cache stays e4m3
    acc = AccuracyChecker()(spec, inputs, got, backend)
    assert acc["verdict"] == "approx-pass" and acc["tensors"]["out"]["cosine"] > 0.9999


def test_fp8_end_to_end_on_the_cli(tmp_path):
    """verify --dtype fp8,fp8-head: the bf16-only backend is skipped with its reason, the correct fp8 kernel
    passes approximately, the one that ignores its descales fails; the bf16 comparison is stored."""
    db = tmp_path / "v.db"
    res = attnbench("verify", "--device", "cpu", "--backends", "naive,test-fp8,test-fp8-no-descale",
                    "--dtype", "fp8", "fp8-head", "--seq-lens", "33", "--kv-seq-lens", "80", "--q-heads", "4",
                    "--kv-heads", "2", "--head-size", "32", "--causal", "--db", str(db), "--json")
    assert "Traceback" not in res.stderr, res.stderr
    rows = json.loads(res.stdout)
    by = {(r["backend"], r["case"].split()[-2]): r for r in rows}
    for dtype in ("fp8", "fp8-head"):
        assert by[("naive", dtype)]["status"] == "unsupported" and "dtype" in by[("naive", dtype)]["reason"]
        assert by[("test-fp8", dtype)]["accuracy"]["verdict"] == "approx-pass"
        assert by[("test-fp8-no-descale", dtype)]["accuracy"]["verdict"] == "approx-fail"
    stored = query(db, "SELECT dtype, accuracy FROM records WHERE backend = 'test-fp8'")
    assert sorted(d for d, _ in stored) == ["fp8", "fp8-head"]
    for _, acc in stored:
        acc = json.loads(acc)
        assert acc["unquantized"]["tensors"]["out"]["rel_l1"] > acc["tensors"]["out"]["rel_l1"]
    text = attnbench("verify", "--device", "cpu", "--backends", "test-fp8", "--dtype", "fp8", "--seq-lens", "16",
                     "--q-heads", "2", "--head-size", "16", "--db", str(db), "--details").stdout
    assert "fp8 inputs, judged approximately" in text and "Against the bf16 inputs before quantization: out" in text


def test_models_refuse_fp8_in_one_line():
    res = attnbench("e2e", "--device", "cpu", "--dtype", "fp8")
    assert res.returncode == 2 and "fp8 inputs are for kernel runs" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1

"""MLA with absorbed weights: the case, its inputs (the value is the latent part of the key row), the exact
reference against the unabsorbed computation, mutations that must fail, and the CPU backends on it."""

from __future__ import annotations

import pytest
import torch

from attnbench import metrics
from attnbench.accuracy.reference import reference_attention
from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

LATENT, ROPE, NOPE, DV = 64, 16, 32, 24
"""Small stand-ins for DeepSeek's 512 / 64 / 128 / 128 (latent, rope, per-head nope and value widths)."""


def mla_spec(**kw) -> AttnSpec:
    base = dict(seqlens_q=(1, 2, 1), seqlens_k=(40, 57, 9), heads_q=4, heads_kv=1, head_dim=LATENT + ROPE,
                head_dim_v=LATENT, dtype="fp64", causal=True, mla=True, scale=(NOPE + ROPE) ** -0.5)
    return AttnSpec(**{**base, **kw})


def test_the_value_is_the_latent_part_of_the_key_row():
    spec = mla_spec()
    inputs = make_inputs(spec)
    assert inputs.v.data_ptr() == inputs.k.data_ptr() and inputs.v.shape[-1] == LATENT
    assert torch.equal(inputs.v, inputs.k[..., :LATENT])
    assert "mla" in spec.label() and spec.to_dict()["mla"] is True
    assert "mla" not in AttnSpec().to_dict()  # old case ids unchanged
    assert AttnSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("fields, message", [
    (dict(head_dim_v=LATENT + ROPE), "must be below the head size"),
    (dict(pass_="fwd_bwd"), "forward"),
    (dict(sinks=True), "forward"),
])
def test_mla_cases_that_are_not_mla_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        mla_spec(**fields)


def test_bytes_read_the_latent_cache_once_as_flashmlas_benchmark_counts():
    spec = mla_spec(dtype="bf16")
    tokens, queries = sum(spec.seqlens_k), sum(spec.seqlens_q)
    d, dv = spec.head_dim, spec.head_dim_v
    # FlashMLA's benchmark/bench_flash_mla.py: (Σ s_k · h_kv · d + b · s_q · h_q · d + b · s_q · h_q · dv) · 2
    flashmla = (tokens * d + queries * 4 * d + queries * 4 * dv) * 2
    lse = queries * 4 * metrics.LSE_BYTES
    assert metrics.bytes_moved(spec) == flashmla + lse
    assert metrics.kv_bytes(spec) == tokens * d * 2
    # FLOPs: s_q · Σ s_k · h_q · (d + dv) · 2 for non-causal single-query rows
    one = mla_spec(seqlens_q=(1, 1), seqlens_k=(40, 57), causal=False)
    assert metrics.flops(one) == 97 * 4 * (d + dv) * 2


def _unabsorbed_and_absorbed(seed: int = 0):
    """DeepSeek's attention written out (per-head keys and values up-projected from the latent) and the same
    problem in absorbed form (an MLA case's inputs): returns (spec, inputs, the written-out output, W_UV)."""
    gen = torch.Generator().manual_seed(seed)
    spec = mla_spec()
    heads, n = spec.heads_q, len(spec.seqlens_q)
    inputs = make_inputs(spec, seed=seed)
    w_uk = torch.randn(heads, NOPE, LATENT, generator=gen, dtype=torch.float64) / LATENT ** 0.5
    w_uv = torch.randn(heads, LATENT, DV, generator=gen, dtype=torch.float64) / LATENT ** 0.5
    q_nope = torch.randn(inputs.q.shape[0], heads, NOPE, generator=gen, dtype=torch.float64)
    q_rope = inputs.q[..., LATENT:].clone()
    # absorbed: the query's latent part is W_UK^T q_nope, per head
    q = torch.cat([torch.einsum("thn,hnl->thl", q_nope, w_uk), q_rope], dim=-1)
    inputs = type(inputs)(**{**vars(inputs), "q": q})
    latent, rope = inputs.k[:, 0, :LATENT], inputs.k[:, 0, LATENT:]
    outs, cq, ck = [], inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    for i in range(n):
        c, kr = latent[ck[i]:ck[i + 1]], rope[ck[i]:ck[i + 1]]
        k = torch.cat([torch.einsum("sl,hnl->hsn", c, w_uk), kr.expand(heads, -1, -1)], dim=-1)  # (h, s, 192)
        v = torch.einsum("sl,hld->hsd", c, w_uv)
        qi = torch.cat([q_nope[cq[i]:cq[i + 1]], q_rope[cq[i]:cq[i + 1]]], dim=-1).transpose(0, 1)  # (h, sq, 192)
        s = qi @ k.transpose(1, 2) * spec.softmax_scale
        sq, sk = qi.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        s = s.masked_fill(~keep, float("-inf"))
        outs.append((torch.softmax(s, dim=-1) @ v).transpose(0, 1))
    return spec, inputs, torch.cat(outs), w_uv


def test_the_reference_equals_deepseeks_unabsorbed_attention():
    spec, inputs, written_out, w_uv = _unabsorbed_and_absorbed()
    ref = reference_attention(spec, inputs, grads=False, dtype=torch.float64)
    out = torch.einsum("thl,hld->thd", ref.out, w_uv)  # the up-projection of the latent output
    torch.testing.assert_close(out, written_out, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mutation", ["rope dropped", "scale of 576", "value from the wrong slice"])
def test_mutations_of_mla_fail(mutation):
    spec, inputs, written_out, w_uv = _unabsorbed_and_absorbed(seed=1)
    if mutation == "rope dropped":
        inputs = type(inputs)(**{**vars(inputs), "q": torch.cat([inputs.q[..., :LATENT], 0 * inputs.q[..., LATENT:]], -1)})
    elif mutation == "scale of 576":
        spec = spec.replace(scale=None)  # the kernels' default 1/sqrt(576), not DeepSeek's 1/sqrt(192)
    else:
        inputs = type(inputs)(**{**vars(inputs), "v": inputs.k[..., ROPE:]})  # the last LATENT dims, not the first
    ref = reference_attention(spec, inputs, grads=False, dtype=torch.float64)
    out = torch.einsum("thl,hld->thd", ref.out, w_uv)
    assert (out - written_out).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["naive", "sdpa-math"])
def test_cpu_backends_run_mla_as_the_reference(name):
    spec = mla_spec()
    inputs = make_inputs(spec, seed=2)
    got = registry.get(name).prepare_case(spec, inputs).fn().out
    want = reference_attention(spec, inputs, grads=False, dtype=torch.float64).out
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_the_mla_kernels_take_mla_cases_only():
    plain = AttnSpec(seqlens_q=(1, 1), seqlens_k=(64, 128), heads_q=16, heads_kv=1, head_dim=576, head_dim_v=512)
    mla = plain.replace(mla=True)
    for name in ("flashmla", "fa3-mla", "flashinfer-mla"):
        backend = registry.get(name)
        assert "MLA" in backend.extra_reason(plain, "cuda")
    assert "64" in registry.get("flashmla").extra_reason(mla.replace(page_size=16), "cuda")
    assert registry.get("flashmla").extra_reason(mla, "cuda") is None
    with pytest.raises(ValueError, match="one KV head, not 2"):  # the case itself: no kernel gets to see it
        mla.replace(heads_kv=2)


SERVING_FA3 = {"FLASHATTENTION_DISABLE_HDIM96": True, "FLASHATTENTION_DISABLE_HDIM192": True,
               "FLASHATTENTION_DISABLE_HDIM256": True, "FLASHATTENTION_DISABLE_FP16": True,
               "FLASHATTENTION_DISABLE_FP8": True, "FLASH_ATTENTION_DISABLE_HDIMDIFF64": False,
               "FLASH_ATTENTION_DISABLE_HDIMDIFF192": True}
"""The serving FlashAttention-3 wheel's build flags (its flash_attn_config), the build fa3-mla runs on."""


def test_the_mla_kernels_take_deepseeks_decode_shape(monkeypatch):
    # every MLA kernel was refused on the GPU with "head size > 512" (fa3-mla: "> 128") after the default head-size
    # bound went down to 512: their own extra checks passed, the capability check did not
    from attnbench.backends import fa3, mla
    from attnbench.backends.base import check_capabilities
    monkeypatch.setattr(fa3, "build_flags", lambda: SERVING_FA3)
    monkeypatch.setattr(mla, "build_flags", lambda: SERVING_FA3)
    decode = AttnSpec(seqlens_q=(1,) * 4, seqlens_k=(700, 65, 1500, 3000), heads_q=128, heads_kv=1, head_dim=576,
                      head_dim_v=512, dtype="bf16", causal=True, mla=True, page_size=64)
    for name in ("flashmla", "fa3-mla", "flashinfer-mla"):
        backend = registry.get(name)
        assert check_capabilities(backend.capabilities, decode, "cuda") is None, name
        assert backend.extra_reason(decode, "cuda") is None, name
    monkeypatch.setattr(mla, "build_flags", lambda: SERVING_FA3 | {"FLASH_ATTENTION_DISABLE_HDIMDIFF64": True})
    assert "HDIMDIFF64" in registry.get("fa3-mla").extra_reason(decode, "cuda")


def test_the_cli_runs_the_deepseek_preset_on_the_cpu(tmp_path):
    from reliability_helpers import attnbench
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--preset", "deepseek-v3",
                    "--batch", "2q1kv40..90", "--q-heads", "4", "--backends", "naive,sdpa-math", "--quiet",
                    "--repeat", "2", "--db", str(db))
    assert res.returncode == 0, res.stderr
    import sqlite3
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT backend, status, spec FROM records").fetchall()
    assert sorted((b, s) for b, s, _ in rows) == [("naive", "ok"), ("sdpa-math", "ok")]
    assert all('"mla": true' in spec and '"head_dim": 576' in spec for _, _, spec in rows)


def test_flex_runs_mla_with_a_value_narrower_than_the_key():
    from attnbench.backends.flex import FlexBackend
    backend = FlexBackend(compile=False, cpu=True)  # eager on the CPU; compiled on a GPU
    spec = mla_spec(dtype="fp32")
    if backend.unavailable_reason():
        pytest.skip(backend.unavailable_reason())
    inputs = make_inputs(spec, seed=4)
    got = backend.prepare_case(spec, inputs).fn().out
    want = reference_attention(spec, inputs, grads=False, dtype=torch.float64).out
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fields, message", [({"page_size": 16}, "pages of 64 tokens, not 16"),
                                             ({"head_dim": 320, "head_dim_v": 256}, "head size 320")])
def test_a_named_mla_kernel_that_takes_none_of_the_cases_is_an_error(monkeypatch, fields, message):
    """--backends flashmla with a page size or latent/rope widths FlashMLA does not take: one line naming why
    (the CLI exits 2 on a UserError), not a sweep of unsupported records."""
    from attnbench.cli.common import UserError
    from attnbench.cli.run import check_named_backends as check_serving
    backend = registry.get("flashmla")
    monkeypatch.setattr(type(backend), "unavailable_reason", lambda self: None)  # as where FlashMLA is installed
    case = AttnSpec(**({"seqlens_q": (1, 1), "seqlens_k": (100, 200), "heads_q": 16, "heads_kv": 1, "head_dim": 576,
                        "head_dim_v": 512, "dtype": "bf16", "causal": True, "mla": True} | fields))
    with pytest.raises(UserError, match=message):
        check_serving(("flashmla",), [case], "cuda")
    check_serving(("flashmla", "naive"), [case.replace(page_size=None, head_dim=576, head_dim_v=512)], "cuda")

"""Adapters of third-party kernels, run against stand-ins with the real signatures (fake_kernels.py):
layouts, flags, cu_seqlens, scale and packing reach the kernel as the real API documents, and the
result equals the naive backend (forward and, where the kernel has one, backward)."""

from __future__ import annotations

import importlib

import fake_kernels as fk
import pytest
import torch

from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec


def spec_(**kw) -> AttnSpec:
    base = dict(batch=2, seqlens_q=(17,), heads_q=4, head_dim=16, dtype="fp64", pass_="fwd")
    return AttnSpec(**(base | kw))


def run(name: str, spec: AttnSpec, seed: int = 3):
    inputs = make_inputs(spec, "cpu", seed=seed)
    prepared = registry.get(name).prepare(spec, inputs)
    return inputs, prepared, prepared.fn()


def assert_matches_naive(spec: AttnSpec, got, seed: int = 3, tol: float = 1e-9):
    ref = registry.get("naive").prepare(spec, make_inputs(spec, "cpu", seed=seed)).fn()
    for key, t in ref.tensors().items():
        torch.testing.assert_close(getattr(got, key), t, rtol=tol, atol=tol, msg=key)


# ---- flash-attn 2 ----------------------------------------------------------------------------------
FA2_CASES = [
    ("fa2", spec_(heads_kv=2, causal=True, seqlens_k=(33,), pass_="fwd_bwd")),
    ("fa2", spec_(window=(5, 3), pass_="bwd", layout="bhsd")),
    ("fa2-qkvpacked", spec_(causal=True, pass_="fwd_bwd")),
    ("fa2-kvpacked", spec_(heads_kv=1, seqlens_k=(9,), causal=True, pass_="fwd_bwd")),
    ("fa2-varlen", spec_(seqlens_q=(17, 5, 33), seqlens_k=(9, 5, 40), heads_kv=2, causal=True, pass_="fwd_bwd")),
    ("fa2-varlen", spec_(heads_kv=2, window=(4, -1), pass_="fwd_bwd")),  # dense, flattened
    ("fa2-varlen-qkvpacked", spec_(seqlens_q=(17, 5, 33), causal=True, window=(6, -1), pass_="fwd_bwd")),
]


@pytest.mark.parametrize("name, spec", FA2_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FA2_CASES)])
def test_fa2_family_matches_naive_fwd_and_bwd(fake, name, spec):
    fake("fa2")
    assert "cuda" in registry.get(name).supports(spec, "cpu")  # real kernels are CUDA-only
    _, prepared, got = run(name, spec)
    assert_matches_naive(spec, got)
    assert prepared.info["kernel"].startswith("flash_attn.flash_attn_")
    assert prepared.info["version"] == "0.0.0-fake"


def test_fa2_arguments(fake):
    fake("fa2")
    spec = spec_(heads_kv=2, causal=True, window=(5, 3), scale=0.3)
    inputs, _, got = run("fa2", spec)
    (call,) = fk.calls("flash_attn_func")
    assert call["q"].data_ptr() == inputs.q.data_ptr() and call["q"].shape == (2, 17, 4, 16)  # bshd, no copy
    assert call["k"].shape == (2, 17, 2, 16)  # GQA: kv heads passed as they are
    assert call["causal"] is True and tuple(call["window_size"]) == (5, 0)  # causal folds the right side
    assert call["softmax_scale"] == 0.3 and call["dropout_p"] == 0.0 and call["return_attn_probs"] is True
    assert got.lse.shape == (2, 4, 17)


def test_fa2_packing_happens_once_in_prepare(fake):
    fake("fa2")
    spec = spec_(causal=True)
    inputs, prepared, _ = run("fa2-qkvpacked", spec)
    prepared.fn()
    first, second = fk.calls("flash_attn_qkvpacked_func")
    assert first["qkv"].shape == (2, 17, 3, 4, 16)
    assert first["qkv"].data_ptr() == second["qkv"].data_ptr()  # the same packed tensor every call
    torch.testing.assert_close(first["qkv"][:, :, 1], inputs.k)


def test_fa2_varlen_cu_seqlens_and_flattened_dense(fake):
    fake("fa2")
    spec = spec_(seqlens_q=(17, 5), seqlens_k=(9, 11), heads_kv=2)
    inputs, _, got = run("fa2-varlen", spec)
    (call,) = fk.calls("flash_attn_varlen_func")
    assert torch.equal(call["cu_seqlens_q"], inputs.cu_seqlens_q)
    assert torch.equal(call["cu_seqlens_k"], inputs.cu_seqlens_k)
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (17, 11)
    assert got.lse.shape == (4, 44)
    dense = spec_(seqlens_q=(7,), seqlens_k=(9,))
    _, prepared, got = run("fa2-varlen", dense)
    call = fk.calls("flash_attn_varlen_func")[-1]
    assert call["q"].shape == (14, 4, 16) and call["cu_seqlens_k"].tolist() == [0, 9, 18]
    assert got.out.shape == (2, 7, 4, 16) and got.lse.shape == (2, 4, 7) and prepared.info["flattened_dense"]


def test_fa2_varlen_qkvpacked_arguments(fake):
    fake("fa2")
    spec = spec_(seqlens_q=(17, 5, 33), batch=1)
    inputs, _, _ = run("fa2-varlen-qkvpacked", spec)
    (call,) = fk.calls("flash_attn_varlen_qkvpacked_func")
    assert call["qkv"].shape == (55, 3, 4, 16) and call["max_seqlen"] == 33
    assert torch.equal(call["cu_seqlens"], inputs.cu_seqlens_q)


# ---- FlashAttention-3 / 4 -------------------------------------------------------------------------
@pytest.mark.parametrize("name, family, spec", [
    ("fa3", "fa3", spec_(heads_kv=2, causal=True, seqlens_k=(33,), pass_="fwd_bwd")),
    ("fa3-varlen", "fa3", spec_(seqlens_q=(17, 5), seqlens_k=(9, 5), window=(3, 2), pass_="fwd_bwd")),
    ("fa4", "fa4", spec_(heads_kv=2, causal=True, window=(5, -1), pass_="fwd_bwd")),
    ("fa4", "fa4", spec_(window=(-1, 4), seqlens_k=(30,))),
    ("fa4-varlen", "fa4", spec_(seqlens_q=(17, 5), seqlens_k=(20, 5), causal=True, pass_="fwd_bwd")),
])
def test_fa3_fa4_match_naive(fake, name, family, spec):
    fake(family)
    _, _, got = run(name, spec)
    assert_matches_naive(spec, got)
    assert got.lse is not None


def test_fa3_fa4_arguments(fake):
    fake("fa3")
    run("fa3", spec_(scale=0.25))
    (call,) = fk.calls("fa3.flash_attn_func")
    assert call["return_attn_probs"] is True and tuple(call["window_size"]) == (-1, -1)
    assert call["softmax_scale"] == 0.25
    fake("fa4")
    run("fa4", spec_(window=(5, -1)))
    (call,) = fk.calls("fa4.flash_attn_func")
    assert tuple(call["window_size"]) == (5, None) and call["return_lse"] is True and call["causal"] is False


def test_fa4_alone_makes_fa2_report_its_missing_function(fake):
    fake("fa4")  # the FA4 wheel ships flash_attn/cute without flash_attn_func
    reason = registry.get("fa2").supports(spec_(dtype="bf16"), "cuda")
    assert "has no flash_attn_func" in reason
    assert registry.get("fa4").unavailable_reason() is None


def test_fa4_refuses_the_copy_inside_flash_attn_2s_wheel(fake, monkeypatch):
    fake("fa4")  # flash_attn.cute imports, as FA2's wheel makes it do once the CUTLASS DSL is installed
    import attnbench.backends.fa4 as fa4_module
    versions = {"flash-attn": "2.8.3.post2"}
    monkeypatch.setattr(fa4_module, "_dist_version", versions.get)
    reason = registry.get("fa4").unavailable_reason()
    assert "copy inside flash-attn 2.8.3.post2's wheel, not flash-attn-4" in reason
    versions["flash-attn-4"] = "4.0.0b36"  # the real FA4 wheel beside it: FA4 runs
    assert registry.get("fa4").unavailable_reason() is None


# ---- xformers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, bias", [
    (spec_(heads_kv=2, causal=True, seqlens_k=(33,), pass_="fwd_bwd"), "LowerTriangularFromBottomRightMask"),
    (spec_(window=(5, 3), pass_="fwd_bwd"), "LocalAttentionFromBottomRightMask"),
    (spec_(window=(-1, 3)), "LocalAttentionFromBottomRightMask"),
    (spec_(seqlens_q=(17, 5), seqlens_k=(20, 9), heads_kv=1, causal=True, pass_="fwd_bwd"),
     "BlockDiagonalCausalFromBottomRightMask"),
    (spec_(seqlens_q=(17, 5), causal=True, window=(4, 0)), "BlockDiagonalCausalLocalAttentionFromBottomRightMask"),
    (spec_(seqlens_q=(17, 5), seqlens_k=(3, 9)), "BlockDiagonalMask"),
])
def test_xformers_matches_naive_with_the_right_bias(fake, spec, bias):
    fake("xformers")
    assert registry.get("xformers").extra_reason(spec, "cuda") is None
    _, prepared, got = run("xformers", spec)
    assert_matches_naive(spec, got)
    assert prepared.info["attn_bias"] == bias


def test_xformers_gqa_uses_5d_form_without_copying_kv(fake):
    fake("xformers")
    run("xformers", spec_(heads_q=6, heads_kv=2, scale=0.5))
    (call,) = fk.calls("memory_efficient_attention")
    assert call["query"].shape == (2, 17, 2, 3, 16) and call["key"].shape == (2, 17, 2, 3, 16)
    assert call["key"].stride(3) == 0 and call["value"].stride(3) == 0  # expanded view, not repeated
    assert call["scale"] == 0.5


def test_xformers_refuses_cases_it_leaves_undefined():
    xf = registry.get("xformers")
    assert "without keys" in xf.extra_reason(spec_(seqlens_q=(20,), seqlens_k=(9,), causal=True), "cuda")
    assert "causal" in xf.extra_reason(spec_(seqlens_q=(17, 5), window=(4, -1)), "cuda")


# ---- SageAttention --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, spec", [
    ("sage", spec_(heads_kv=2, causal=True)),
    ("sage", spec_(layout="bhsd", seqlens_k=(30,))),
    ("sage-varlen", spec_(seqlens_q=(17, 5, 33), heads_kv=2, causal=True)),
    ("sage-varlen", spec_(seqlens_q=(17,), seqlens_k=(9,))),
])
def test_sage_v1_never_mutates_the_callers_inputs(fake, name, spec):
    fake("sage")
    inputs = make_inputs(spec, "cpu", seed=4)
    before = {n: getattr(inputs, n).clone() for n in ("q", "k", "v")}
    prepared = registry.get(name).prepare(spec, inputs)
    got = prepared.fn()
    prepared.fn()
    for n, t in before.items():
        assert torch.equal(getattr(inputs, n), t), f"{n} was changed"
    call = fk.calls(fk.sageattn.__name__ if name == "sage" else "sageattn_varlen")[0]
    assert call["k"].data_ptr() != inputs.k.data_ptr() and call["smooth_k"] is True
    assert call["sm_scale"] == spec.softmax_scale and call["is_causal"] is spec.causal
    assert prepared.info["includes_preprocess"] is True and prepared.info["exact"] is False
    assert_matches_naive(spec, got, seed=4)


def test_sage_layout_follows_storage(fake):
    fake("sage")
    run("sage", spec_())
    run("sage", spec_(layout="bhsd"))
    nhd, hnd = fk.calls("sageattn")
    assert nhd["tensor_layout"] == "NHD" and nhd["q"].shape == (2, 17, 4, 16)
    assert hnd["tensor_layout"] == "HND" and hnd["q"].shape == (2, 4, 17, 16) and hnd["q"].is_contiguous()


@pytest.mark.parametrize("name", ["sage2-fp8", "sage2-fp8-sm90", "sage2-fp16"])
def test_sage2_entry_points(fake, name):
    fake("sage2")
    spec = spec_(heads_kv=2, causal=True)
    inputs, prepared, got = run(name, spec)
    assert_matches_naive(spec, got)
    (call,) = fk.calls(registry.get(name).function)
    assert call["k"].data_ptr() == inputs.k.data_ptr()  # version 2 does not write into K: no copy needed
    assert call["tensor_layout"] == "NHD" and call["is_causal"] is True and prepared.info["api"] == "v2"
    assert "has no sageattn" in registry.get("sage").unavailable_reason()


def test_sage_options_reach_the_kernel(fake):
    fake("sage2")
    backend = registry.get("sage2-fp8").__class__(pv_accum_dtype="fp32+fp32")
    backend.prepare(spec_(), make_inputs(spec_(), "cpu")).fn()
    assert fk.calls("sageattn_qk_int8_pv_fp8_cuda")[0]["pv_accum_dtype"] == "fp32+fp32"


# ---- SpargeAttn -----------------------------------------------------------------------------------
def test_sparge_knobs_and_sparsity(fake):
    fake("sparge")
    from attnbench.backends.sparge import Sparge, SpargeCdf
    spec = spec_(seqlens_q=(130,), heads_q=2)
    inputs = make_inputs(spec, "cpu", seed=3)
    prepared = Sparge(topk=0.2).prepare(spec, inputs)
    assert_matches_naive(spec, prepared.fn())
    first, timed = fk.calls("spas_sage2_attn_meansim_topk_cuda")
    assert first["return_sparsity"] is True and timed["return_sparsity"] is False  # no host sync when timed
    assert timed["topk"] == 0.2 and timed["scale"] == spec.softmax_scale and timed["is_causal"] is False
    assert timed["output_dtype"] == torch.float64 and timed["tensor_layout"] == "NHD"
    assert prepared.info["sparsity"] == fk.SPARSITY
    assert prepared.info["knobs"] == {"topk": 0.2, "simthreshd1": -0.1, "cdfthreshd": None, "pvthreshd": 50}
    assert SpargeCdf().prepare(spec, inputs).info["knobs"]["cdfthreshd"] == 0.98
    with pytest.raises(ValueError, match="unknown knob"):
        SpargeCdf(topk=0.5)


def test_sparge_limits():
    sp = registry.get("sparge")
    assert ">= 128" in sp.extra_reason(spec_(seqlens_q=(64,)), "cuda")
    assert sp.extra_reason(spec_(seqlens_q=(128,)), "cuda") is None


# ---- flashinfer -----------------------------------------------------------------------------------
def test_flashinfer_single_prefill(fake):
    fake("flashinfer")
    spec = spec_(batch=1, heads_kv=2, causal=True, window=(6, -1), seqlens_k=(30,))
    _, prepared, got = run("flashinfer", spec)
    assert_matches_naive(spec, got)
    first, call = fk.calls("single_prefill_with_kv_cache")  # prepare's first call (the JIT build), then run's
    assert prepared.info["first_call_s"] >= 0 and first["q"].shape == call["q"].shape
    assert call["q"].shape == (17, 4, 16) and call["k"].shape == (30, 2, 16) and call["kv_layout"] == "NHD"
    assert call["causal"] is True and call["window_left"] == 6 and call["sm_scale"] == spec.softmax_scale


@pytest.mark.parametrize("spec", [
    spec_(seqlens_q=(17, 5, 33), seqlens_k=(20, 5, 40), heads_kv=2, causal=True),
    spec_(batch=3, window=(4, -1)),
    spec_(batch=3, window=(4, 0)),  # bounded right side 0 without causal: passed as causal=True
])
def test_flashinfer_ragged_wrapper_planned_once_in_prepare(fake, monkeypatch, spec):
    fake("flashinfer")
    monkeypatch.setattr("attnbench.backends.flashinfer.WORKSPACE_BYTES", 1024)
    inputs, prepared, got = run("flashinfer", spec)
    prepared.fn()
    assert_matches_naive(spec, got)
    (plan,) = fk.calls("plan")
    assert len(fk.calls("run")) == 3  # prepare's first call (builds the JIT module), run's, and the one above
    assert "first_call_s" in prepared.info
    want_cu = inputs.cu_seqlens_q if inputs.varlen else torch.arange(0, 17 * 4, 17, dtype=torch.int32)
    assert torch.equal(plan["qo_indptr"], want_cu)
    assert plan["head_dim_qk"] == 16 and plan["q_data_type"] == torch.float64 and plan["num_kv_heads"] == spec.heads_kv
    assert plan["causal"] is (spec.causal or spec.window == (4, 0))


def test_flashinfer_sinks_build_a_jit_module_per_head_size(fake):
    """FlashInfer's sink wrapper names its JIT module without the head size, so a machine's first build ran for
    every head size (garbage for the others, seen on an H200); attnbench names the module after the head sizes."""
    fake("flashinfer")
    for d in (16, 32):
        spec = spec_(seqlens_q=(7,), seqlens_k=(19,), heads_kv=2, head_dim=d, causal=True, sinks=True)
        _, prepared, got = run("flashinfer", spec)
        assert_matches_naive(spec, got)
        assert prepared.info["jit_module"] == f"batch_prefill_attention_sink_float64_float64_qk{d}_vo{d}_swa_False_fa3"
    inits = fk.calls("prefill.init")
    assert [i["jit_args"][0] for i in inits] == [f"batch_prefill_attention_sink_float64_float64_qk{d}_vo{d}_swa_False_fa3"
                                                 for d in (16, 32)]
    assert [i["jit_args"][5:7] for i in inits] == [[16, 16], [32, 32]]
    assert all(i["backend"] == "fa3" and i["jit_args"][12] == fk.SINK_DECL["fa3"] for i in inits)
    window = spec_(seqlens_q=(7,), seqlens_k=(19,), heads_kv=2, window=(3, 0), sinks=True)
    _, prepared, got = run("flashinfer", window)
    assert_matches_naive(window, got)
    assert prepared.info["jit_module"].endswith("_swa_True_fa3")
    assert fk.calls("prefill.init")[-1]["jit_kwargs"]["use_sliding_window"] is True


def test_flashinfer_window_must_be_left_only():
    assert "left side only" in registry.get("flashinfer").extra_reason(spec_(window=(3, 2)), "cuda")
    assert registry.get("flashinfer").extra_reason(spec_(window=(3, 2), causal=True), "cuda") is None


# ---- torch varlen_attn (CUDA-only in torch: replaced by a stand-in with the same signature) --------
def _fake_varlen(monkeypatch, legacy: bool):
    mod = importlib.import_module("torch.nn.attention.varlen")
    seen = []
    if legacy:  # torch 2.10: is_causal=, no window_size / enable_gqa
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None,
                        scale=None):
            seen.append(dict(locals()))
            out, lse = fk.varlen_ref(query, key, value, cu_seq_q, cu_seq_k, scale, is_causal, None)
            return (out, lse) if return_aux is not None and return_aux.lse else out
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
            seen.append(dict(locals()))
            assert enable_gqa or query.shape[1] == key.shape[1]
            is_causal = window_size == (-1, 0)  # the real function compares with a tuple, as here
            window = None if is_causal or tuple(window_size) == (-1, -1) else tuple(window_size)
            out, lse = fk.varlen_ref(query, key, value, cu_seq_q, cu_seq_k, scale, is_causal, window)
            return (out, lse) if return_aux is not None and return_aux.lse else out
    monkeypatch.setattr(mod, "varlen_attn", varlen_attn)
    return seen


@pytest.mark.parametrize("spec", [
    spec_(seqlens_q=(17, 5, 33), seqlens_k=(9, 5, 40), heads_kv=2, causal=True, pass_="fwd_bwd"),
    spec_(heads_kv=1, window=(4, 2), seqlens_k=(30,)),
])
def test_sdpa_varlen_arguments_and_result(monkeypatch, spec):
    seen = _fake_varlen(monkeypatch, legacy=False)
    inputs, prepared, got = run("sdpa-varlen", spec)
    assert_matches_naive(spec, got)
    call = seen[0]
    assert call["window_size"] == (-1, 0) if spec.causal else call["window_size"] == (4, 2)
    assert isinstance(call["window_size"], tuple) and call["enable_gqa"] is True and call["scale"] == spec.softmax_scale
    assert call["return_aux"].lse is True and prepared.info["gqa"] == "native"
    if inputs.varlen:
        assert torch.equal(call["cu_seq_q"], inputs.cu_seqlens_q) and call["max_k"] == 40
    else:
        assert call["query"].shape == (34, 4, 16) and got.lse.shape == (2, 4, 17)


def test_sdpa_varlen_on_torch_2_10_signature(monkeypatch):
    seen = _fake_varlen(monkeypatch, legacy=True)
    spec = spec_(seqlens_q=(17, 5), heads_kv=2, causal=True)
    _, prepared, got = run("sdpa-varlen", spec)
    assert_matches_naive(spec, got)
    assert seen[0]["is_causal"] is True and seen[0]["key"].shape[1] == 4  # K/V heads expanded in prepare
    assert prepared.info["gqa"] == "expanded"
    assert "window" in registry.get("sdpa-varlen").extra_reason(spec_(window=(3, 0)), "cuda")


def test_xformers_refuses_what_it_would_send_to_an_fa3_build_without_it(monkeypatch):
    """On Hopper xformers hands FA3's cases to the installed flash_attn_3; a template the build left out
    crashes the process (windows under the trimmed wheel, fp16 under the bf16-only serving build)."""
    import attnbench.backends.fa3 as fa3_module
    import attnbench.backends.xformers as xformers_module
    monkeypatch.setattr(xformers_module, "_hopper", lambda device: True)
    flags = {"FLASHATTENTION_DISABLE_LOCAL": True, "FLASHATTENTION_DISABLE_FP16": True}
    monkeypatch.setattr(fa3_module, "build_flags", lambda: flags)
    backend = registry.get("xformers")
    window = backend.extra_reason(spec_(window=(64, 0), dtype="bf16"), "cuda")
    assert "sliding window" in window and "built without FP16, LOCAL" in window
    assert "dtype fp16" in backend.extra_reason(spec_(causal=True, dtype="fp16"), "cuda")
    assert "dtype fp16" in backend.extra_reason(spec_(seqlens_q=(17, 5), dtype="fp16"), "cuda")  # varlen too
    assert backend.extra_reason(spec_(causal=True, dtype="bf16"), "cuda") is None  # the build has it
    assert backend.extra_reason(spec_(dtype="fp32"), "cuda") is None  # not FA3's: xformers picks another operator
    monkeypatch.setattr(xformers_module, "_hopper", lambda device: False)
    assert backend.extra_reason(spec_(causal=True, dtype="fp16"), "cuda") is None  # not sent to FA3 before Hopper
    monkeypatch.setattr(xformers_module, "_hopper", lambda device: True)
    flags.clear()  # a full FA3 build
    assert backend.extra_reason(spec_(window=(64, 0)), "cuda") is None

"""The seed kernels' adapters say what really runs and fail cleanly where a build lacks something:
FlashAttention-3 trimmed builds, SageAttention 2's dispatching ``sageattn``, SpargeAttn's causal
handling, the models' zero-copy path into layout-taking kernels, and flash-attn's custom-op internals
under the distributed FA2 kernel. Stand-ins with the real signatures (fake_kernels.py), on CPU."""

from __future__ import annotations

import fake_kernels as fk
import pytest
import torch

from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec


def spec_(**kw) -> AttnSpec:
    base = dict(batch=2, seqlens_q=(130,), heads_q=2, head_dim=64, dtype="fp64", pass_="fwd")
    return AttnSpec(**(base | kw))


def naive(spec: AttnSpec, inputs):
    return registry.get("naive").prepare(spec, inputs).fn()


# ---- FlashAttention-3: what the installed build has ---------------------------------------------------
@pytest.mark.parametrize("name", ["fa3", "fa3-varlen"])
def test_fa3_trimmed_build_refuses_what_it_lacks_with_the_switch_named(fake, name):
    fake("fa3-trimmed")
    fa3 = registry.get(name)
    bf16 = dict(dtype="bf16")
    window = fa3.supports(spec_(window=(64, 0), **bf16), "cuda")
    assert "sliding window not supported in this FlashAttention-3 build" in window and "LOCAL" in window
    assert "head size > 128" in fa3.supports(spec_(head_dim=256, **bf16), "cuda")
    assert "value head size" in fa3.supports(spec_(head_dim_v=128, **bf16), "cuda")
    for ok in (spec_(head_dim=32, **bf16), spec_(head_dim=96, **bf16),
               spec_(head_dim=128, causal=True, heads_kv=1, pass_="fwd_bwd", **bf16)):
        assert fa3.supports(ok, "cuda") is None, ok.label()  # 32 and 96 run the 64 and 128 kernels; causal is not LOCAL
    assert "multiple of 8" in fa3.supports(spec_(head_dim=60, **bf16), "cuda")


def test_fa3_not_installed_says_only_that():
    reason = registry.get("fa3").supports(spec_(window=(64, 0), dtype="bf16"), "cuda")
    assert "not importable" in reason and "build" not in reason


def test_fa3_full_build_keeps_every_feature(fake):
    fake("fa3")
    fa3 = registry.get("fa3")
    assert fa3.supports(spec_(window=(64, 0), head_dim=256, dtype="bf16"), "cuda") is None
    assert fa3.capabilities.window and fa3.capabilities.max_head_dim == 256


def test_fa3_records_the_build_switches(fake):
    fake("fa3-trimmed")
    spec = spec_(seqlens_q=(17,), head_dim=16, causal=True)
    info = registry.get("fa3").prepare(spec, make_inputs(spec, "cpu", seed=1)).info
    assert "LOCAL" in info["build_disabled"] and "HDIM256" in info["build_disabled"]
    assert "HDIM128" not in info["build_disabled"]


# ---- SageAttention 2: the kernel sageattn dispatched to is named -----------------------------------------
def test_sage_names_the_sageattention2_kernel_that_ran(fake):
    fake("sage22")
    sage = registry.get("sage")
    assert sage.description.startswith("SageAttention 2") and "v1" not in sage.description
    spec = spec_(seqlens_q=(17,), head_dim=16, causal=True)
    inputs = make_inputs(spec, "cpu", seed=2)
    prepared = sage.prepare(spec, inputs)
    torch.testing.assert_close(prepared.fn().out, naive(spec, inputs).out)
    assert prepared.info["kernel"] == ("sageattention.sageattn -> "
                                       "sageattn_qk_int8_pv_fp8_cuda_sm90(pv_accum_dtype=fp32+fp32)")
    assert prepared.info["dispatched_to"] == "sageattn_qk_int8_pv_fp8_cuda_sm90"
    assert prepared.info["k_copied"] is False and prepared.info["api"] == "v2"  # v2 leaves K alone
    call = fk.calls("sageattn_qk_int8_pv_fp8_cuda_sm90")[-1]
    assert call["k"].data_ptr() == inputs.k.data_ptr()
    assert fk.sageattn_qk_int8_pv_fp8_cuda_sm90.__name__ == "sageattn_qk_int8_pv_fp8_cuda_sm90"  # spy removed


def test_sage_names_its_kernel_without_prepare_too(fake, monkeypatch):
    """Models call ``functional`` (no prepare): the backends line and base_info name the kernel from a tiny call."""
    fake("sage22")
    import attnbench.backends.sage as sage_mod
    sage = registry.get("sage")
    assert sage.dispatch_on("cpu") == "sageattn_qk_int8_pv_fp8_cuda_sm90(pv_accum_dtype=fp32+fp32)"
    monkeypatch.setattr(sage_mod, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(sage_mod, "_DISPATCH", {})
    assert sage.describe("cpu").endswith("here sageattn_qk_int8_pv_fp8_cuda_sm90(pv_accum_dtype=fp32+fp32)")


def test_sage_dispatch_follows_the_architecture(fake, monkeypatch):
    fake("sage22")
    monkeypatch.setattr(fk, "SAGE2_ARCH", "sm80")
    spec = spec_(seqlens_q=(17,), head_dim=16)
    info = registry.get("sage").prepare(spec, make_inputs(spec, "cpu", seed=2)).info
    assert info["dispatched_to"] == "sageattn_qk_int8_pv_fp16_cuda"


def test_sage_version_1_is_described_as_such(fake):
    fake("sage")
    sage = registry.get("sage")
    spec = spec_(seqlens_q=(17,), head_dim=16)
    info = sage.prepare(spec, make_inputs(spec, "cpu", seed=2)).info
    assert "Triton" in sage.description and info["kernel"] == "sageattention.sageattn (v1 Triton kernels)"
    assert info["k_copied"] is True


# ---- SpargeAttn: causal only where the kernel applies it ---------------------------------------------------
@pytest.mark.parametrize("name", ["sparge", "sparge-cdf"])
def test_sparge_fp8_pv_refuses_causal_with_the_reason(fake, name):
    fake("sparge")
    reason = registry.get(name).supports(spec_(causal=True, dtype="fp16"), "cuda")
    assert "is_causal=False" in reason and "sparge-fp16" in reason
    assert registry.get(name).supports(spec_(dtype="fp16"), "cuda") is None


@pytest.mark.parametrize("name, function", [("sparge-fp16", "spas_sage_attn_meansim_topk_cuda"),
                                            ("sparge-fp16-cdf", "spas_sage_attn_meansim_cuda")])
def test_sparge_fp16_pv_runs_causal_through_the_kernel(fake, name, function):
    fake("sparge")
    spec = spec_(causal=True)
    assert registry.get(name).supports(spec.replace(dtype="fp16"), "cuda") is None
    inputs = make_inputs(spec, "cpu", seed=5)
    prepared = registry.get(name).prepare(spec, inputs)
    torch.testing.assert_close(prepared.fn().out, naive(spec, inputs).out)
    assert fk.calls(function)[-1]["is_causal"] is True and prepared.info["sparsity"] == fk.SPARSITY


def test_the_fp8_kernel_would_have_been_wrong_for_causal(fake):
    """Why the refusal matters: the FP8-PV kernel runs unmasked, which the exact reference would catch."""
    fake("sparge")
    from attnbench.backends.sparge import Sparge
    spec = spec_(causal=True)
    inputs = make_inputs(spec, "cpu", seed=5)
    got = Sparge().prepare(spec, inputs).fn().out
    assert (got - naive(spec, inputs).out).abs().max() > 1e-2


# ---- models call the kernels on their own tensors, without copies -------------------------------------------
@pytest.mark.parametrize("family, name, function", [
    ("sage22", "sage", "sageattn"), ("sage2", "sage2-fp8-sm90", "sageattn_qk_int8_pv_fp8_cuda_sm90"),
    ("sparge", "sparge-fp16", "spas_sage_attn_meansim_topk_cuda"), ("sparge", "sparge", "spas_sage2_attn_meansim_topk_cuda"),
])
def test_functional_hands_the_models_tensors_to_the_kernel_as_stored(fake, family, name, function):
    fake(family)
    q_bhsd, k_bhsd, v_bhsd = (torch.randn(2, 3, 130, 16, dtype=torch.float64) for _ in range(3))
    spec = spec_(heads_q=3, head_dim=16, layout="bhsd")
    fn = registry.get(name).functional(spec)
    out = fn(q_bhsd.transpose(1, 2), k_bhsd.transpose(1, 2), v_bhsd.transpose(1, 2))  # the swap's bshd views
    call = fk.calls(function)[-1]
    assert call["tensor_layout"] == "HND" and call["q"].data_ptr() == q_bhsd.data_ptr() and call["q"].is_contiguous()
    assert "return_sparsity" not in call or call["return_sparsity"] is False  # no host sync inside the model
    ref = torch.softmax(q_bhsd @ k_bhsd.transpose(-1, -2) / 4, -1) @ v_bhsd
    torch.testing.assert_close(out, ref.transpose(1, 2))
    bshd = [t.transpose(1, 2).contiguous() for t in (q_bhsd, k_bhsd, v_bhsd)]  # bshd storage goes in as NHD
    fn(*bshd)
    assert fk.calls(function)[-1]["tensor_layout"] == "NHD"


# ---- the distributed FA2 kernel reaches flash-attn's custom ops ---------------------------------------------
def test_call_with_reads_the_signature_behind_a_custom_op():
    from attnbench.distributed.kernels import _call_with

    @torch.library.custom_op("attnbench_test::scaled_copy", mutates_args=())
    def scaled_copy(x: torch.Tensor, dropout_p: float, softmax_scale: float) -> torch.Tensor:
        return x * softmax_scale + dropout_p

    x = torch.ones(3)
    got = _call_with(scaled_copy, {"dropout_p": 0.0, "softmax_scale": 2.0, "unknown": 1}, (x,))
    torch.testing.assert_close(got, 2 * x)


# ---- the CogVideoX-2b table's kernel rows -----------------------------------------------------------------
def test_kernel_tally_counts_copies_and_adds():
    from attnbench.models.bench import tally_kernels
    kernels = [("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(...)>", 0.5),
               ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>", 0.25),
               ("flash_fwd_kernel", 3.0), ("void at::native::elementwise_kernel<direct_copy_kernel_cuda>", 0.5),
               ("Memset (Device)", 0.01), ("Memcpy DtoD (Device -> Device)", 0.02)]  # not kernels
    got = tally_kernels(kernels)
    assert got == {"kernels": 4, "kernels_ms": 4.25, "copy_kernels": 2, "copy_ms": 1.0, "add_kernels": 1,
                   "add_ms": 0.25}


def test_kernel_counts_need_a_gpu(tmp_path):
    from reliability_helpers import attnbench
    res = attnbench("e2e", "--model", "llama-tiny", "--device", "cpu",
                    "--kernel-counts", "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2 and "kernel counts need a CUDA device" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("family, name, function", [("fa2", "fa2", "flash_attn_func"),
                                                    ("fa3", "fa3", "fa3.flash_attn_func")])
def test_flash_attn_functional_takes_the_models_views_and_differentiates(fake, family, name, function):
    fake(family)
    q_bhsd, k_bhsd, v_bhsd = (torch.randn(2, 3, 33, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    spec = spec_(seqlens_q=(33,), heads_q=3, head_dim=16, causal=True, pass_="fwd_bwd")
    out = registry.get(name).functional(spec)(*(t.transpose(1, 2) for t in (q_bhsd, k_bhsd, v_bhsd)))
    assert fk.calls(function)[-1]["q"].data_ptr() == q_bhsd.data_ptr()  # no copy on the way in
    mask = torch.ones(33, 33, dtype=torch.bool).tril()
    scores = (q_bhsd @ k_bhsd.transpose(-1, -2) / 4).masked_fill(~mask, float("-inf"))
    ref = (torch.softmax(scores, -1) @ v_bhsd).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.sum(), (q_bhsd, k_bhsd, v_bhsd))
    ref_grads = torch.autograd.grad(ref.sum(), (q_bhsd, k_bhsd, v_bhsd))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)

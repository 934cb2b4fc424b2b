"""The blocked exact reference equals fp64 naive attention + autograd, with bounded memory."""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnbench.accuracy.reference import (
    BlockSizes,
    attention_backward,
    attention_forward,
    exact_attention,
    exact_fp32_matmul,
    reference_attention,
)
from attnbench.backends.naive import naive_attention
from attnbench.inputs import make_inputs, split_varlen
from attnbench.spec import AttnSpec

SMALL_BLOCKS = BlockSizes(q=16, k=24)  # many partial blocks on odd sizes


def naive_fp64(q, k, v, dout, causal, window, scale):
    """out, lse, dq, dk, dv of dense bshd fp64 tensors by the full score matrix and autograd."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out = naive_attention(q, k, v, causal=causal, window=window, scale=scale)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.double())
    groups = q.shape[2] // k.shape[2]
    scores = torch.matmul(q.transpose(1, 2), k.repeat_interleave(groups, 2).transpose(1, 2).transpose(-2, -1)) * scale
    from attnbench.masks import keep_mask
    keep = keep_mask(q.shape[1], k.shape[1], causal, window)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    return {"out": out.detach(), "lse": torch.logsumexp(scores, -1).detach(), "dq": dq, "dk": dk, "dv": dv}


def assert_matches(ref, expected, tol=1e-10):
    for name, want in expected.items():
        got = getattr(ref, name)
        assert got.shape == want.shape, name
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(got), finite), name
        torch.testing.assert_close(got[finite], want[finite].to(got.dtype), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("sq, sk, hq, hkv, causal, window", [
    (17, 17, 2, 2, False, None),
    (77, 77, 4, 2, True, None),
    (17, 77, 3, 1, True, None),      # causal, fewer queries than keys (lower-right aligned)
    (77, 17, 2, 2, True, None),      # causal, more queries: the first 60 rows attend nothing
    (577, 577, 2, 1, True, None),
    (77, 77, 2, 2, False, (5, 3)),   # sliding window
    (77, 60, 2, 1, True, (9, -1)),   # window + causal, q != k
    (60, 77, 2, 2, False, (-1, 4)),
])
@pytest.mark.parametrize("small", [True, False], ids=["small-blocks", "default-blocks"])
def test_dense_matches_fp64_naive(sq, sk, hq, hkv, causal, window, small):
    # Small tiles cut every sequence into several partial blocks; default tiles give one block.
    blocks = BlockSizes(q=max(16, sq // 6), k=max(24, sk // 5)) if small else BlockSizes()
    spec = AttnSpec(batch=2, seqlens_q=(sq,), seqlens_k=(sk,), heads_q=hq, heads_kv=hkv, head_dim=16, head_dim_v=8,
                    dtype="fp32", causal=causal, window=window, pass_="fwd_bwd")
    inputs = make_inputs(spec, "cpu", seed=4)
    ref = reference_attention(spec, inputs, blocks=blocks)
    assert ref.out.dtype == torch.float64 and ref.lse.shape == (2, hq, sq)
    expected = naive_fp64(inputs.q, inputs.k, inputs.v, inputs.dout, causal, window, spec.softmax_scale)
    assert_matches(ref, expected)


def test_varlen_matches_each_sequence_and_lse_is_heads_by_tokens():
    spec = AttnSpec(batch=2, seqlens_q=(17, 5, 33), seqlens_k=(20, 5, 9), heads_q=4, heads_kv=2, head_dim=8,
                    dtype="bf16", causal=True, pass_="fwd_bwd")
    inputs = make_inputs(spec, "cpu", seed=2)
    ref = reference_attention(spec, inputs, blocks=SMALL_BLOCKS)
    tq = inputs.q.shape[0]
    assert ref.out.shape == (tq, 4, 8) and ref.lse.shape == (4, tq) and ref.dk.shape == inputs.k.shape
    pieces = zip(split_varlen(inputs.q, inputs.cu_seqlens_q), split_varlen(inputs.k, inputs.cu_seqlens_k),
                 split_varlen(inputs.v, inputs.cu_seqlens_k), split_varlen(inputs.dout, inputs.cu_seqlens_q),
                 strict=True)
    cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    for i, (q, k, v, do) in enumerate(pieces):
        want = naive_fp64(q[None], k[None], v[None], do[None], True, None, spec.softmax_scale)
        (a, b), (c, d) = cu_q[i:i + 2], cu_k[i:i + 2]
        torch.testing.assert_close(ref.out[a:b], want["out"][0])
        torch.testing.assert_close(ref.lse[:, a:b], want["lse"][0])
        torch.testing.assert_close(ref.dq[a:b], want["dq"][0])
        torch.testing.assert_close(ref.dk[c:d], want["dk"][0])
        torch.testing.assert_close(ref.dv[c:d], want["dv"][0])


def test_rows_without_keys_give_zero_out_minus_inf_lse_zero_grads():
    spec = AttnSpec(seqlens_q=(9,), seqlens_k=(4,), heads_q=2, head_dim=4, dtype="fp64", causal=True, pass_="fwd_bwd")
    ref = reference_attention(spec, make_inputs(spec, "cpu"), blocks=BlockSizes(q=3, k=2))
    assert (ref.out[0, :5] == 0).all() and (ref.out[0, 5:] != 0).all()
    assert torch.isneginf(ref.lse[0, :, :5]).all() and torch.isfinite(ref.lse[0, :, 5:]).all()
    assert (ref.dq[0, :5] == 0).all() and torch.isfinite(ref.dk).all() and torch.isfinite(ref.dv).all()


def test_bhsd_layout_gives_same_values_in_bshd_shape():
    a = AttnSpec(seqlens_q=(33,), heads_q=3, head_dim=8, dtype="fp64", causal=True, layout="bhsd")
    inputs = make_inputs(a, "cpu")
    ref = reference_attention(a, inputs, blocks=SMALL_BLOCKS)
    want = naive_fp64(inputs.q, inputs.k, inputs.v, inputs.dout, True, None, a.softmax_scale)
    assert_matches(ref, want)


def test_forward_only_leaves_gradients_out():
    spec = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")
    ref = reference_attention(spec, make_inputs(spec, "cpu"), grads=False)
    assert ref.dq is None and set(ref.tensors()) == {"out", "lse"}


@pytest.mark.parametrize("causal, window, sq, sk", [(False, None, 5, 5), (True, None, 4, 6), (False, (2, 1), 6, 5)])
def test_gradcheck_of_the_autograd_wrapper(causal, window, sq, sk):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, sq, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, sk, 1, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, sk, 1, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    blocks = BlockSizes(q=2, k=3)
    assert torch.autograd.gradcheck(lambda a, b, c: exact_attention(a, b, c, causal=causal, window=window,
                                                                    blocks=blocks), (q, k, v))


def test_fp32_reference_is_close_to_fp64():
    spec = AttnSpec(seqlens_q=(77,), heads_q=4, heads_kv=2, head_dim=16, dtype="bf16", causal=True)
    inputs = make_inputs(spec, "cpu")
    r32 = reference_attention(spec, inputs, dtype=torch.float32, blocks=SMALL_BLOCKS)
    r64 = reference_attention(spec, inputs, dtype=torch.float64)
    assert r32.out.dtype == torch.float32
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(getattr(r32, name).double(), getattr(r64, name), rtol=1e-5, atol=1e-5)


class LargestTensor(TorchFunctionMode):
    """Records the largest tensor any torch call returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return result


def test_memory_stays_bounded_no_full_score_matrix():
    b, h, s, d = 1, 2, 301, 8
    q, k, v, do = (torch.randn(b, s, h, d, dtype=torch.float64) for _ in range(4))
    blocks = BlockSizes(q=32, k=64)
    with LargestTensor() as spy:
        out, lse = attention_forward(q, k, v, causal=True, blocks=blocks)
        attention_backward(q, k, v, out, lse, do, causal=True, blocks=blocks)
    assert spy.largest <= max(b * s * h * d, b * h * 32 * 64)  # outputs or one score block
    assert spy.largest < b * h * s * s


def test_block_rows_shrink_to_respect_the_element_cap():
    q, k, v, do = (torch.randn(3, 100, 4, 8, dtype=torch.float64) for _ in range(4))
    blocks = BlockSizes(q=64, k=50, max_elems=3 * 4 * 10 * 50)
    with LargestTensor() as spy:
        attention_forward(q, k, v, blocks=blocks)
    assert spy.largest <= 3 * 4 * 10 * 50 or spy.largest == q.numel()


def test_causal_skips_fully_masked_key_blocks():
    calls = {"n": 0}

    class CountBmm(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.bmm:
                calls["n"] += 1
            return func(*args, **(kwargs or {}))

    q, k, v = (torch.randn(1, 256, 1, 8, dtype=torch.float64) for _ in range(3))
    counts = {}
    for causal in (False, True):
        calls["n"] = 0
        with CountBmm():
            attention_forward(q, k, v, causal=causal, blocks=BlockSizes(q=32, k=32))
        counts[causal] = calls["n"]
    assert counts[False] == 64 and counts[True] == 36  # 8x8 tiles vs the 8*9/2 on or below the diagonal


def test_tf32_switch_restores_the_callers_settings():
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9")
    before = (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    with exact_fp32_matmul():
        assert matmul.fp32_precision == "ieee" and torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    with pytest.raises(RuntimeError), exact_fp32_matmul():
        raise RuntimeError("boom")
    assert (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before


def test_bad_block_sizes_are_rejected():
    with pytest.raises(ValueError, match="block size q"):
        BlockSizes(q=0)

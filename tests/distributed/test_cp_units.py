"""Pieces of context parallelism that need no process group: layouts, merge, kernels, block plans."""

from __future__ import annotations

import inspect

import pytest
import torch

from attnbench.distributed import kernels as kmod
from attnbench.distributed import layout as lay
from attnbench.distributed.bench import _default_ulysses
from attnbench.distributed.kernels import KernelUnavailable, get_kernel
from attnbench.distributed.reference import exact_attention
from attnbench.distributed.ring import DIAG, FULL, KV_FRONT, Q_BACK, SKIP, block_kind, merge
from attnbench.distributed.ulysses import check_heads
from attnbench.spec import AttnSpec


def test_zigzag_positions_balance_causal_work():
    assert lay.positions(8, "zigzag", 0, 2).tolist() == [0, 1, 6, 7]
    assert lay.positions(8, "zigzag", 1, 2).tolist() == [2, 3, 4, 5]
    # every rank attends the same number of causal pairs
    work = [int((lay.positions(64, "zigzag", r, 4) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1


def test_usp_positions_nest_zigzag_over_ring_then_split_over_ulysses():
    got = [lay.positions(16, "zigzag", r, 4, ulysses_degree=2).tolist() for r in range(4)]
    assert got == [[0, 1, 2, 3], [12, 13, 14, 15], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_shard_unshard_roundtrip_odd_chunks():
    x = torch.randn(2, 68, 3, 5)  # zigzag chunks of 17
    shards = [lay.zigzag_shard(x, r, 2) for r in range(2)]
    assert shards[0].shape == (2, 34, 3, 5)
    assert torch.equal(lay.zigzag_unshard(shards), x)
    idx = [lay.positions(68, "contiguous", r, 4) for r in range(4)]
    assert torch.equal(lay.unshard([lay.shard(x, i) for i in idx], idx), x)


def test_check_seq_len_suggests_neighbours():
    with pytest.raises(ValueError, match=r"100 is not a multiple of 8 .* 96 or 104"):
        lay.check_seq_len(100, "zigzag", 4)
    with pytest.raises(ValueError, match=r"use e.g. 4"):
        lay.check_seq_len(3, "contiguous", 4)
    lay.check_seq_len(96, "zigzag", 4)
    assert lay.natural_block("zigzag", 4, ulysses_degree=2) == 4  # lcm(2*2, 2*2)
    assert lay.natural_block("zigzag", 8, ulysses_degree=4) == 8  # lcm(2*2, 2*4)


def test_block_plan():
    assert block_kind(2, 2, True, True) == DIAG
    assert block_kind(2, 1, True, True) == KV_FRONT
    assert block_kind(1, 2, True, True) == Q_BACK
    assert block_kind(1, 2, True, False) == SKIP
    assert block_kind(2, 1, True, False) == FULL
    assert block_kind(0, 3, False, True) == FULL


def _rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("kernel_name", ["sdpa-math", "sdpa-flash"])
def test_merge_of_key_blocks_equals_full_attention(kernel_name):
    # Three key blocks merged in the log-sigmoid form give full attention, in any order; the backward
    # of each block given the merged out/lse sums to the full gradients (what the ring relies on).
    kernel = get_kernel(kernel_name, "cpu")
    q, k, v, do = _rand(2, 24, 4, 8), _rand(2, 30, 2, 8), _rand(2, 30, 2, 8), _rand(2, 24, 4, 8)
    full = exact_attention(q, k, v, do, causal=False, scale=0.3)
    blocks = [slice(0, 10), slice(10, 17), slice(17, 30)]
    for order in ([0, 1, 2], [2, 0, 1]):
        out = lse = None
        for i in order:
            bo, bl = kernel.fwd(q, k[:, blocks[i]], v[:, blocks[i]], False, 0.3)
            if out is None:
                out, lse = bo.double(), bl.transpose(1, 2).unsqueeze(-1).double()
            else:
                out, lse = merge(out, lse, bo, bl)
        torch.testing.assert_close(out, full["out"], atol=1e-12, rtol=0)
    lse_bhs = lse.squeeze(-1).transpose(1, 2)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in blocks:
        bdq, bdk, bdv = kernel.bwd(do, q, k[:, b], v[:, b], out, lse_bhs, False, 0.3)
        dq += bdq
        dk[:, b] += bdk
        dv[:, b] += bdv
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(got, full[name], atol=1e-12, rtol=0)


def test_merge_survives_huge_lse():
    out = torch.ones(1, 2, 1, 4)
    lse = torch.full((1, 2, 1, 1), 1e4)
    block_out, block_lse = torch.zeros(1, 2, 1, 4), torch.full((1, 1, 2), 1e4)
    new_out, new_lse = merge(out, lse, block_out, block_lse)
    assert torch.isfinite(new_out).all() and torch.allclose(new_out, torch.full_like(new_out, 0.5))
    assert torch.allclose(new_lse, torch.full_like(new_lse, 1e4 + 0.6931471805599453))


def test_kernels_without_lse_are_refused():
    with pytest.raises(KernelUnavailable, match="log-sum-exp"):
        get_kernel("sdpa")
    with pytest.raises(KernelUnavailable, match="log-sum-exp.*use one of sdpa-flash"):
        get_kernel("flex")  # an attnbench backend, but not one whose log-sum-exp dist can merge
    with pytest.raises(KernelUnavailable, match="unknown --kernel 'nope'; the local kernels: sdpa-flash"):
        get_kernel("nope")
    assert "runs on cuda" in get_kernel("sdpa-flash", "cuda").reason("cpu", "bf16")
    assert "takes fp16, bf16" in get_kernel("sdpa-cudnn").reason("cuda", "fp32")
    assert get_kernel("sdpa-math").reason("cpu", "bf16") is None


def test_local_kernels_go_by_the_backends_names_and_the_old_ones_still_work():
    # sdpa-flash is aten's CPU flash op on a CPU, its CUDA op on a GPU, as the sdpa-flash backend is
    assert get_kernel("sdpa-flash", "cpu").description.endswith("_for_cpu")
    assert "flash_attention" in get_kernel("sdpa-flash", "cuda").description
    for old, new in (("math", "sdpa-math"), ("flash", "sdpa-flash"), ("cpu-flash", "sdpa-flash"),
                     ("cudnn", "sdpa-cudnn"), ("efficient", "sdpa-efficient")):
        assert get_kernel(old, "cpu").name == new


def test_fa2_adapter_needs_the_package_or_says_so():
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(KernelUnavailable, match="flash-attn"):
            get_kernel("fa2")


def test_fa4_kernel_refuses_the_copy_inside_flash_attn_2(monkeypatch):
    """flash-attn 2's wheel carries an old flash_attn.cute that imports and then fails inside the CuTe DSL
    (AttributeError, seen on an H100): the kernel is refused as the fa4 backend is, before any import."""
    versions = {"flash-attn": "2.8.3.post2", "flash-attn-4": None}
    monkeypatch.setattr("attnbench.backends.fa4._dist_version", versions.get)
    with pytest.raises(KernelUnavailable, match="copy inside flash-attn 2.8.3.post2's wheel"):
        get_kernel("fa4")


def test_fa3_adapter_calls_its_low_level_ops_and_refuses_a_missing_template(monkeypatch):
    """FA3 through flash_attn_interface's _flash_attn_forward / _flash_attn_backward (their 3.0 signatures,
    backward's flag named is_causal), stood in for by the math kernel; a head size above the build's largest
    template is refused before any call, since the real build crashes the process instead of raising, while
    one between templates runs with the next larger one the build has; a dtype the build lacks is refused."""
    import sys
    import types

    from attnbench.backends import fa3 as fa3_backend
    seen = []

    def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None, cu_seqlens_q=None,
                            cu_seqlens_k=None, softmax_scale=None, causal=False, window_size_left=-1,
                            window_size_right=-1, softcap=0.0, num_splits=1, pack_gqa=None, sm_margin=0):
        seen.append(("fwd", causal, softmax_scale))
        out, lse = kmod.math_fwd(q, k, v, causal, softmax_scale)
        return out, lse, None, None

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, dq=None,
                             dk=None, dv=None, softmax_scale=None, is_causal=False, window_size_left=-1,
                             window_size_right=-1, softcap=0.0, deterministic=False, sm_margin=0):
        seen.append(("bwd", is_causal, softmax_scale))
        for dst, src in zip((dq, dk, dv), kmod.math_bwd(dout, q, k, v, out, softmax_lse, is_causal, softmax_scale)):
            dst.copy_(src)

    monkeypatch.setitem(sys.modules, "flash_attn_interface", types.SimpleNamespace(
        _flash_attn_forward=_flash_attn_forward, _flash_attn_backward=_flash_attn_backward))
    monkeypatch.setitem(sys.modules, "flash_attn_config", types.SimpleNamespace(CONFIG={"build_flags": {
        f"FLASHATTENTION_DISABLE_HDIM{d}": True for d in (96, 192, 256)} | {"FLASHATTENTION_DISABLE_FP16": True}}))
    fa3_backend.build_flags.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        kernel = get_kernel("fa3")
        # a build without fp16 raises on it: the job refuses it up front (bench.py asks reason())
        assert kernel.reason("cuda", "fp16") == "kernel fa3 takes bf16, not fp16"
        assert kernel.reason("cuda", "bf16") is None
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(1, 24, 2, 32, dtype=torch.float64) for _ in range(4))
        out, lse = kernel.fwd(q, k, v, True, 0.2)
        want_out, want_lse = kmod.math_fwd(q, k, v, True, 0.2)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
        grads = kernel.bwd(do, q, k, v, out, lse, True, 0.2)
        for got, want in zip(grads, kmod.math_bwd(do, q, k, v, out, lse, True, 0.2)):
            assert torch.allclose(got, want)
        assert seen == [("fwd", True, 0.2), ("bwd", True, 0.2)]
        q80 = torch.randn(1, 8, 2, 80, dtype=torch.float64)  # no 96 template: the build runs it with the 128 one
        kernel.fwd(q80, q80, q80, False, 0.1)
        q160 = torch.randn(1, 8, 2, 160, dtype=torch.float64)  # above the build's largest template
        with pytest.raises(KernelUnavailable, match="above 128.*HDIM192, HDIM256"):
            kernel.fwd(q160, q160, q160, False, 0.1)
        assert len(seen) == 3
    finally:
        fa3_backend.build_flags.cache_clear()


def test_call_with_follows_the_flash_attn_signatures():
    seen = {}

    def fa2_27(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
               alibi_slopes, return_softmax):  # flash-attn 2.6.3+/2.7 _flash_attn_forward
        seen.update(locals())
        return "out", "lse", None, None

    def fa2_25(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_softmax):
        seen.update(locals())
        return ("out", None, None, None, None, "lse", None, None)

    values = {"dropout_p": 0.0, "window_size": (-1, -1), "window_size_left": -1, "window_size_right": -1,
              "softcap": 0.0, "alibi_slopes": None, "softmax_scale": 0.1, "causal": True, "return_softmax": False}
    assert kmod._call_with(fa2_27, values, (1, 2, 3))[:2] == ("out", "lse")
    assert seen["window_size_left"] == -1 and seen["causal"] is True and seen["q"] == 1
    kmod._call_with(fa2_25, values, (1, 2, 3))
    assert seen["window_size"] == (-1, -1)

    def needs_more(q, k, v, mystery):
        return None

    with pytest.raises(KernelUnavailable, match="mystery"):
        kmod._call_with(needs_more, values, (1, 2, 3))


def test_aten_op_schemas_match_the_adapters():
    # The argument order the CUDA adapters use, checked against this torch's registered schemas.
    ops = torch.ops.aten
    names = lambda op: [a.name for a in op.default._schema.arguments]  # noqa: E731
    assert names(ops._scaled_dot_product_flash_attention_backward)[:15] == [
        "grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
        "dropout_p", "is_causal", "philox_seed", "philox_offset", "scale"]
    assert names(ops._scaled_dot_product_efficient_attention_backward)[4:12] == [
        "attn_bias", "out", "logsumexp", "philox_seed", "philox_offset", "dropout_p", "grad_input_mask", "is_causal"]
    assert names(ops._scaled_dot_product_cudnn_attention_backward)[4:15] == [
        "out", "logsumexp", "philox_seed", "philox_offset", "attn_bias", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
        "dropout_p", "is_causal"]
    assert names(ops._scaled_dot_product_cudnn_attention)[3:8] == [
        "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "return_debug_mask"]
    assert "attn_mask" in names(ops._scaled_dot_product_flash_attention_for_cpu_backward)
    assert inspect.signature(kmod.math_bwd).parameters.keys() == inspect.signature(kmod.cpu_flash_bwd).parameters.keys()


def test_ulysses_head_check_and_default_degree():
    with pytest.raises(ValueError, match=r"kv-heads \(2\) is not a multiple of 4"):
        check_heads(8, 2, 4)
    check_heads(8, 4, 4)
    assert _default_ulysses(8, AttnSpec(heads_q=32, heads_kv=8)) == 8
    assert _default_ulysses(4, AttnSpec(heads_q=6, heads_kv=6)) == 2


def test_ulysses_pipeline_chunks_divide_the_heads_each_rank_holds():
    from attnbench.distributed.ulysses import pipeline_chunks
    assert pipeline_chunks(32, 32, 2) == 4 and pipeline_chunks(16, 8, 2) == 4 and pipeline_chunks(8, 4, 2) == 2
    assert pipeline_chunks(6, 2, 2) == 1  # one kv-head per rank: nothing to split
    assert pipeline_chunks(32, 32, 4, 2) == 2
    with pytest.raises(ValueError, match="must divide the heads each rank holds"):
        pipeline_chunks(12, 12, 2, 4)


def test_long_tailed_documents_fill_the_batch_seeded_with_a_long_tail():
    from attnbench.distributed.documents import long_tailed
    lengths = long_tailed(1 << 20, 8192, seed=0)
    assert sum(lengths) == 1 << 20 and min(lengths) >= 1
    assert lengths == long_tailed(1 << 20, 8192, seed=0) != long_tailed(1 << 20, 8192, seed=1)
    body = sorted(lengths)[:-1]  # the last document is cut to fit
    assert max(body) > 4 * sorted(body)[len(body) // 2]  # a long tail: the longest far above the median
    with pytest.raises(ValueError, match="mean document length must be in 1..100"):
        long_tailed(100, 101)


def test_document_pieces_follow_the_rows_a_block_holds():
    from attnbench.distributed.documents import Documents, back, front
    from attnbench.distributed.layout import runs as shard_ranges
    docs = Documents((10, 230, 16))  # the middle document crosses every zigzag chunk of 4 ranks
    rows0 = shard_ranges(256, "zigzag", 0, 4)
    assert rows0 == ((0, 32), (224, 256))
    assert front(rows0, 32) == ((0, 32),) and back(rows0, 32) == ((224, 256),)
    assert front(((0, 10), (20, 30)), 15) == ((0, 10), (20, 25)) and back(((0, 10), (20, 30)), 15) == ((5, 10), (20, 30))
    # rank 0's diagonal block: doc 0 in rows 0-10, doc 1 in rows 10-48 (the end of one chunk and the start of
    # the other, next to each other in storage), doc 2 in the last 16 rows
    assert docs.pieces(rows0, rows0) == [((0, 10), (0, 10)), ((10, 48), (10, 48)), ((48, 64), (48, 64))]
    # rank 3's queries against rank 0's keys share only the middle document
    assert docs.pieces(shard_ranges(256, "zigzag", 3, 4), rows0) == [((0, 64), (10, 48))]
    assert Documents((40, 200, 16)).pieces(((32, 40), (224, 256)), rows0)[0] == ((0, 8), (0, 32))
    assert Documents((128, 128)).pieces(((0, 64),), ((128, 192),)) == []  # no document in common: skipped


def test_per_document_kernel_matches_the_exact_packed_result():
    from attnbench.distributed.documents import Documents, exact, whole
    docs = Documents((5, 17, 2, 8))
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 32, 2, 8, generator=g, dtype=torch.float64) for _ in range(4))
    kernel = whole(get_kernel("sdpa-math", "cpu"), docs)
    out, lse = kernel.fwd(q, k, v, True, 0.3)
    dq, dk, dv = kernel.bwd(dout, q, k, v, out, lse, True, 0.3)
    ref = exact(q, k, v, dout, docs, causal=True, scale=0.3)
    for name, got in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(got, ref[name].to(got.dtype), rtol=1e-9, atol=1e-9)
    plain = exact_attention(q, k, v, dout, causal=True, scale=0.3)  # the mask matters for these inputs
    assert (plain["out"] - ref["out"]).abs().max() > 0.1

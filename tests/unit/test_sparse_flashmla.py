"""FlashMLA's sparse calls on CPU through a stand-in with the real parameter lists and FlashMLA's layouts (lse
(s_q, h) from prefill, (b, h, s_q) from decode, +inf for a query with no valid slot, a paged FP8 cache addressed by
page · page_size + offset): the wrappers must hand back the reference's layout and pass the arguments the kernels
check."""

from __future__ import annotations

import math
import types
from dataclasses import replace

import pytest
import torch

from attnbench.accuracy.compare import compare
from attnbench.sparse import flashmla
from attnbench.sparse.fp8 import dequantize_rows, quantize_rows
from attnbench.sparse.indices import make_case
from attnbench.sparse.reference import Selection, reference_sparse

CALLS: list[tuple[str, dict]] = []


def _flashmla_layout(ref):
    """(out bf16 (T, H, 512), lse (T, H) float32 with +inf where there is no key, max_logits (T, H))."""
    lse = ref.lse.T.float()
    return ref.out.bfloat16(), torch.where(torch.isneginf(lse), math.inf, lse), ref.max_logits.T.float()


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    CALLS.append(("prefill", dict(q=q, kv=kv, indices=indices, sm_scale=sm_scale, d_v=d_v, attn_sink=attn_sink,
                                  topk_length=topk_length)))
    assert q.dtype == kv.dtype == torch.bfloat16 and kv.dim() == 3 and kv.shape[1] == 1
    assert indices.dtype == torch.int32 and indices.shape[:2] == (q.shape[0], 1) and indices.shape[2] % 128 == 0
    assert topk_length is None or topk_length.dtype == torch.int32
    ref = reference_sparse(q, kv, Selection(indices=indices[:, 0], lengths=topk_length), scale=sm_scale, d_v=d_v,
                           attn_sink=attn_sink)
    out, lse, top = _flashmla_layout(ref)
    return out, top, lse


def get_mla_metadata(*args, **kwargs):
    return types.SimpleNamespace(have_initialized=False), None


def _scope(cache, indices, lengths):
    """A paged FP8 cache as (rows, Selection) in the reference's form; decode knows only −1 as empty."""
    pages, page, _, width = cache.shape
    assert width == 656 and cache.stride(1) == 656
    b, s_q, k = indices.shape
    assert indices.dtype == torch.int32 and k % 64 == 0
    assert bool(((indices == -1) | ((indices >= 0) & (indices < pages * page))).all())
    per_query = None if lengths is None else lengths.repeat_interleave(s_q)
    return dequantize_rows(cache.view(pages * page, width)), Selection(indices=indices.view(b * s_q, k),
                                                                       lengths=per_query)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    CALLS.append(("decode", dict(q=q, k_cache=k_cache, indices=indices, topk_length=topk_length,
                                 meta=tile_scheduler_metadata)))
    assert num_splits is None and not causal and is_fp8_kvcache and head_dim_v == 512
    assert block_table is None and cache_seqlens is None
    tile_scheduler_metadata.have_initialized = True
    b, s_q, h, d = q.shape
    rows, sel = _scope(k_cache, indices, topk_length)
    extra_rows = extra = None
    if extra_k_cache is not None:
        extra_rows, extra = _scope(extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    ref = reference_sparse(q.view(b * s_q, h, d), rows, sel, scale=softmax_scale, d_v=head_dim_v, attn_sink=attn_sink,
                           extra_kv=extra_rows, extra=extra)
    out, lse, _ = _flashmla_layout(ref)
    return out.view(b, s_q, h, head_dim_v), lse.view(b, s_q, h).transpose(1, 2)


@pytest.fixture
def fake(monkeypatch):
    CALLS.clear()
    module = types.SimpleNamespace(flash_mla_sparse_fwd=flash_mla_sparse_fwd, get_mla_metadata=get_mla_metadata,
                                   flash_mla_with_kvcache=flash_mla_with_kvcache)
    monkeypatch.setitem(__import__("sys").modules, "flash_mla", module)
    return module


def test_prefill_hands_back_the_references_layout(fake):
    case = make_case(7, 37, 64, 13, seed=1, attn_sink=True, lengths=True, empty=0.3)
    call = flashmla.sparse_prefill(case.q, case.kv, case.selection, scale=case.scale, attn_sink=case.attn_sink)
    got = call()
    ref = reference_sparse(case.q, case.kv, case.selection, scale=case.scale, attn_sink=case.attn_sink)
    assert got.out.shape == ref.out.shape and got.lse.shape == ref.lse.shape == (64, 7)
    metrics = compare(got.tensors(), ref.tensors())
    assert metrics["out"]["rel_l2"] < 2 ** -8 and metrics["lse"]["rel_l2"] < 1e-6 and metrics["max_logits"]["rel_l2"] < 1e-6
    assert all("inf_mismatch" not in m and m["nonfinite"] == 0 for m in metrics.values())
    args = CALLS[-1][1]
    assert args["indices"].shape == (7, 1, 128) and (args["indices"][:, 0, 13:] == -1).all()
    assert args["attn_sink"].dtype == torch.float32 and args["sm_scale"] == case.scale
    call()
    assert len(CALLS) == 2  # each call runs the kernel again; the preparation is not repeated


def test_prefill_refuses_what_the_kernel_refuses():
    assert flashmla.prefill_reason(64, 576, 512) is None and flashmla.prefill_reason(128, 512, 512) is None
    assert "64 or 128" in flashmla.prefill_reason(5, 576, 512)
    with pytest.raises(ValueError, match="head sizes"):
        flashmla.sparse_prefill(torch.zeros(1, 64, 100), torch.zeros(3, 100), Selection(indices=torch.zeros(1, 1,
                                dtype=torch.int32)), scale=0.1)


def _decode_case(lengths: bool, extra: bool):
    case = make_case(3 * 2, 45, 5, 13, seed=3, attn_sink=True, empty=0.3, extra=(19, 7) if extra else None)
    sel = case.selection
    if lengths:  # one length per request, shared by its 2 queries
        sel = Selection(indices=sel.indices, lengths=torch.tensor([13, 13, 4, 4, 0, 0]))
    if extra:
        case = replace(case, extra=Selection(indices=case.extra.indices, lengths=torch.tensor([7, 7, 2, 2, 5, 5])))
    return case, sel


@pytest.mark.parametrize("lengths, extra", [(False, False), (True, True)])
def test_decode_hands_back_the_references_layout_over_the_dequantized_rows(fake, lengths, extra):
    case, sel = _decode_case(lengths, extra)
    rows = quantize_rows(case.kv)
    extra_rows = quantize_rows(case.extra_kv) if extra else None
    call = flashmla.sparse_decode(case.q, rows, sel, requests=3, scale=case.scale, attn_sink=case.attn_sink,
                                  extra_rows=extra_rows, extra=case.extra, page=16)
    got = call()
    ref = reference_sparse(case.q, dequantize_rows(rows), sel, scale=case.scale, attn_sink=case.attn_sink,
                           extra_kv=None if not extra else dequantize_rows(extra_rows), extra=case.extra)
    assert got.out.shape == (6, 5, 512) and got.lse.shape == (5, 6)
    metrics = compare(got.tensors(), ref.tensors())
    assert metrics["out"]["rel_l2"] < 2 ** -8 and metrics["lse"]["rel_l2"] < 1e-6
    assert all("inf_mismatch" not in m and m["nonfinite"] == 0 for m in metrics.values())
    args = CALLS[-1][1]
    assert args["k_cache"].shape == (3, 16, 1, 656) and args["indices"].shape == (3, 2, 64)
    assert int(args["indices"].min()) == -1 and int(args["indices"].max()) < 45  # past-the-cache slots became −1
    if lengths:
        assert args["topk_length"].tolist() == [13, 4, 0]
    call()
    assert CALLS[-1][1]["meta"] is args["meta"]  # the scheduling metadata is made once and reused


def test_decode_refuses_lengths_that_differ_within_a_request(fake):
    case = make_case(4, 30, 5, 9, seed=4)
    sel = Selection(indices=case.selection.indices, lengths=torch.tensor([9, 8, 3, 3]))
    with pytest.raises(ValueError, match="one length per request"):
        flashmla.sparse_decode(case.q, quantize_rows(case.kv), sel, requests=2, scale=case.scale)
    with pytest.raises(ValueError, match="requests"):
        flashmla.sparse_decode(case.q, quantize_rows(case.kv), case.selection, requests=3, scale=case.scale)

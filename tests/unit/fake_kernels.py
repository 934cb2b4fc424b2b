"""Stand-ins for third-party attention packages, for testing argument plumbing on CPU.

Every function has the parameter list of the real API (copied from the packages' sources:
flash-attn 2 flash_attn_interface.py, hopper/flash_attn_interface.py, flash_attn/cute/interface.py,
xformers ops/fmha, SageAttention core.py, SpargeAttn core.py, flashinfer prefill.py), records the
arguments it was called with, and computes the documented result with plain PyTorch (differentiable),
so adapters can be checked against the naive backend. Masks follow each package's documented rules.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import torch

from attnbench.backends.naive import naive_attention

CALLS: list[tuple[str, dict]] = []
"""(function name, arguments by name) of every call, in order."""


def _record(name: str, args: dict) -> dict:
    CALLS.append((name, dict(args)))
    return args


def calls(name: str) -> list[dict]:
    return [a for n, a in CALLS if n == name]


# ---- reference maths ----------------------------------------------------------------------------
def _window(window_size, causal: bool):
    left, right = window_size
    if causal:
        right = 0
    return None if (left, right) == (-1, -1) else (left, right)


def dense_ref(q, k, v, scale, causal, window):
    """(B, S, H, D) attention with the lse (B, H, Sq); flash-attn mask semantics."""
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = naive_attention(q, k, v, causal=causal, window=window, scale=scale)
    groups = q.shape[2] // k.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(groups, 2)) * scale
    from attnbench.masks import keep_mask
    keep = keep_mask(q.shape[1], k.shape[1], causal, window)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return out, torch.logsumexp(scores, dim=-1).detach()


def varlen_ref(q, k, v, cu_q, cu_k, scale, causal, window):
    """Packed (T, H, D) attention, per sequence; lse (H, Tq)."""
    outs, lses = [], []
    oq, ok = cu_q.tolist(), cu_k.tolist()
    for a, b, c, d in zip(oq[:-1], oq[1:], ok[:-1], ok[1:], strict=True):
        out, lse = dense_ref(q[None, a:b], k[None, c:d], v[None, c:d], scale, causal, window)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


# ---- flash-attn 2 (flash_attn) ------------------------------------------------------------------
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _record("flash_attn_func", locals())
    out, lse = dense_ref(q, k, v, softmax_scale, causal, _window(window_size, causal))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _record("flash_attn_qkvpacked_func", locals())
    q, k, v = qkv.unbind(dim=2)
    out, lse = dense_ref(q, k, v, softmax_scale, causal, _window(window_size, causal))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _record("flash_attn_kvpacked_func", locals())
    k, v = kv.unbind(dim=2)
    out, lse = dense_ref(q, k, v, softmax_scale, causal, _window(window_size, causal))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    _record("flash_attn_varlen_func", locals())
    out, lse = varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, _window(window_size, causal))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    _record("flash_attn_varlen_qkvpacked_func", locals())
    q, k, v = qkv.unbind(dim=1)
    out, lse = varlen_ref(q, k, v, cu_seqlens, cu_seqlens, softmax_scale, causal, _window(window_size, causal))
    return (out, lse, None) if return_attn_probs else out


# ---- FlashAttention-3 (flash_attn_interface) ----------------------------------------------------
def fa3_values(t, descale, heads_k: int, sequence_of_row=None):
    """An FA3 fp8 input as the values it stands for: each row (a batch entry, or a token of a packed
    tensor, with ``sequence_of_row`` its sequence) times ``descale[sequence, kv head of its group]``; a
    missing descale is 1, as in the kernel. Other dtypes pass through."""
    if t.dtype != torch.float8_e4m3fn:
        return t
    rows = t.shape[0] if sequence_of_row is None else int(sequence_of_row.max()) + 1
    descale = torch.ones(rows, heads_k) if descale is None else descale.double()
    per_head = descale.repeat_interleave(t.shape[-2] // heads_k, dim=1)   # (sequences, H)
    per_row = per_head if sequence_of_row is None else per_head[sequence_of_row]
    return t.double() * per_row.view(t.shape[0], *[1] * (t.dim() - 3), t.shape[-2], 1)


def fa3_flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                        v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    _record("fa3.flash_attn_func", locals())
    fp8, hk = q.dtype == torch.float8_e4m3fn, k.shape[2]
    q, k, v = (fa3_values(t, d, hk) for t, d in ((q, q_descale), (k, k_descale), (v, v_descale)))
    out, lse = dense_ref(q, k, v, softmax_scale, causal, _window(window_size, causal))
    out = out.to(torch.bfloat16) if fp8 else out
    return (out, lse) if return_attn_probs else out


def fa3_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                               seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None,
                               k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                               num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    _record("fa3.flash_attn_varlen_func", locals())
    fp8, hk = q.dtype == torch.float8_e4m3fn, k.shape[1]

    def sequence_of_row(cu):
        return torch.repeat_interleave(torch.arange(len(cu) - 1), cu.diff().long())
    q = fa3_values(q, q_descale, hk, sequence_of_row(cu_seqlens_q))
    k, v = (fa3_values(t, d, hk, sequence_of_row(cu_seqlens_k)) for t, d in ((k, k_descale), (v, v_descale)))
    out, lse = varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, _window(window_size, causal))
    out = out.to(torch.bfloat16) if fp8 else out
    return (out, lse) if return_attn_probs else out


# ---- FlashAttention-4 (flash_attn.cute) ---------------------------------------------------------
def _fa4_window(window_size, causal):
    left, right = (-1 if w is None else w for w in window_size)
    return _window((left, right), causal)


def fa4_flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, mask_mod=None,
                        full_block_cnt=None, full_block_idx=None, mask_block_cnt=None, mask_block_idx=None,
                        block_size=None, return_lse=False):
    _record("fa4.flash_attn_func", locals())
    assert all(w is None or w >= 0 for w in window_size), "FA4 marks an unbounded side with None"
    out, lse = dense_ref(q, k, v, softmax_scale, causal, _fa4_window(window_size, causal))
    return out, (lse if return_lse else None)


def fa4_flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                               seqused_q=None, seqused_k=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, score_mod=None, mask_mod=None,
                               block_sparse_tensors=None, cu_total_m_blocks=None, cu_total_n_blocks=None,
                               aux_tensors=None, return_lse=False):
    _record("fa4.flash_attn_varlen_func", locals())
    out, lse = varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                          _fa4_window(window_size, causal))
    return out, (lse if return_lse else None)


# ---- xformers ------------------------------------------------------------------------------------
class LowerTriangularFromBottomRightMask:
    def keep(self, sq, sk):
        return _band(sq, sk, -1, 0)


@dataclass
class LocalAttentionFromBottomRightMask:
    window_left: int
    window_right: int

    def keep(self, sq, sk):
        return _band(sq, sk, self.window_left, self.window_right)


@dataclass
class BlockDiagonalMask:
    q_seqlen: list
    kv_seqlen: list
    window: tuple = (-1, -1)

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None, *, device=None):
        return cls(list(q_seqlen), list(kv_seqlen if kv_seqlen is not None else q_seqlen))

    def make_causal_from_bottomright(self):
        return BlockDiagonalCausalFromBottomRightMask(self.q_seqlen, self.kv_seqlen, (-1, 0))

    def make_local_attention_from_bottomright(self, window_size):
        return BlockDiagonalCausalLocalAttentionFromBottomRightMask(self.q_seqlen, self.kv_seqlen,
                                                                    (window_size - 1, 0))

    def keep(self, tq, tk):
        keep = torch.zeros(tq, tk, dtype=torch.bool)
        a = c = 0
        for lq, lk in zip(self.q_seqlen, self.kv_seqlen, strict=True):
            keep[a:a + lq, c:c + lk] = _band(lq, lk, *self.window)
            a, c = a + lq, c + lk
        return keep


class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    pass


class BlockDiagonalCausalLocalAttentionFromBottomRightMask(BlockDiagonalMask):
    pass


def _band(sq, sk, left, right):
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None):
    _record("memory_efficient_attention", locals())
    five = query.dim() == 5
    q, k, v = (t.flatten(2, 3) if five else t for t in (query, key, value))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if attn_bias is not None:
        scores = scores.masked_fill(~attn_bias.keep(q.shape[1], k.shape[1]), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v)
    return out.unflatten(2, query.shape[2:4]) if five else out


# ---- SageAttention ------------------------------------------------------------------------------
def _sage_ref(q, k, v, tensor_layout, is_causal, sm_scale):
    if tensor_layout == "HND":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, _ = dense_ref(q, k, v, sm_scale, is_causal, None)
    return out.transpose(1, 2) if tensor_layout == "HND" else out


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
    _record("sageattn", locals())
    if smooth_k:  # version 1 subtracts the mean from the caller's K in place
        k -= k.mean(dim=1 if tensor_layout == "NHD" else 2, keepdim=True)
    return _sage_ref(q, k, v, tensor_layout, is_causal, sm_scale)


def sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, sm_scale=None,
                    smooth_k=True, **kwargs):
    _record("sageattn_varlen", locals())
    if smooth_k:
        k -= k.mean(dim=0, keepdim=True)
    return varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, sm_scale, is_causal, None)[0]


def sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                 sm_scale=None, pv_accum_dtype="fp32+fp16", smooth_k=True, smooth_v=False,
                                 return_lse=False, **kwargs):
    _record("sageattn_qk_int8_pv_fp8_cuda", locals())
    return _sage_ref(q, k, v, tensor_layout, is_causal, sm_scale)


def sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                      sm_scale=None, pv_accum_dtype="fp32+fp32", smooth_k=True, return_lse=False,
                                      **kwargs):
    _record("sageattn_qk_int8_pv_fp8_cuda_sm90", locals())
    return _sage_ref(q, k, v, tensor_layout, is_causal, sm_scale)


def sageattn_qk_int8_pv_fp16_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                  sm_scale=None, pv_accum_dtype="fp32", smooth_k=True, smooth_v=False,
                                  return_lse=False, **kwargs):
    _record("sageattn_qk_int8_pv_fp16_cuda", locals())
    return _sage_ref(q, k, v, tensor_layout, is_causal, sm_scale)


SAGE2_ARCH = "sm90"
"""The GPU the version-2 ``sageattn`` stand-in believes it runs on."""


def sageattn_v2(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """SageAttention 2.2.0's ``sageattn``: hands the call to a kernel function chosen by the GPU architecture,
    looked up in the module's globals at call time as the real one does."""
    _record("sageattn", locals())
    if SAGE2_ARCH == "sm90":
        return sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                                                 sm_scale=sm_scale, return_lse=return_lse, pv_accum_dtype="fp32+fp32")
    return sageattn_qk_int8_pv_fp16_cuda(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                                         sm_scale=sm_scale, return_lse=return_lse, pv_accum_dtype="fp32")


# ---- SpargeAttn ---------------------------------------------------------------------------------
SPARSITY = 0.375


def spas_sage2_attn_meansim_topk_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                      smooth_k=True, simthreshd1=-0.1, cdfthreshd=None, topk=0.35, pvthreshd=50,
                                      attention_sink=False, tensor_layout="HND", output_dtype=torch.float16,
                                      return_sparsity=False, return_lse=False):
    _record("spas_sage2_attn_meansim_topk_cuda", locals())
    out = _sage_ref(q, k, v, tensor_layout, False, scale)  # the real kernel is launched with is_causal=False
    return (out, SPARSITY) if return_sparsity else out


def spas_sage2_attn_meansim_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, smooth_k=True,
                                 simthreshd1=0.6, cdfthreshd=0.98, pvthreshd=50, attention_sink=False,
                                 tensor_layout="HND", output_dtype=torch.float16, return_sparsity=False,
                                 return_lse=False):
    _record("spas_sage2_attn_meansim_cuda", locals())
    out = _sage_ref(q, k, v, tensor_layout, False, scale)  # the real kernel is launched with is_causal=False
    return (out, SPARSITY) if return_sparsity else out


def spas_sage_attn_meansim_topk_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                     smooth_k=True, simthreshd1=-0.1, cdfthreshd=None, topk=0.5, pvthreshd=50,
                                     attention_sink=False, tensor_layout="HND", output_dtype=torch.float16,
                                     return_sparsity=False):
    _record("spas_sage_attn_meansim_topk_cuda", locals())
    out = _sage_ref(q, k, v, tensor_layout, is_causal, scale)  # FP16-PV kernel: is_causal reaches the kernel
    return (out, SPARSITY) if return_sparsity else out


def spas_sage_attn_meansim_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, smooth_k=True,
                                simthreshd1=0.6, cdfthreshd=0.98, pvthreshd=50, attention_sink=False,
                                tensor_layout="HND", output_dtype=torch.float16, return_sparsity=False):
    _record("spas_sage_attn_meansim_cuda", locals())
    out = _sage_ref(q, k, v, tensor_layout, is_causal, scale)
    return (out, SPARSITY) if return_sparsity else out


# ---- flashinfer ---------------------------------------------------------------------------------
def _fi_window(window_left, causal):
    return None if window_left < 0 else (window_left, 0 if causal else -1)


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
                                 packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
                                 rope_scale=None, rope_theta=None, backend="auto", return_lse=False):
    _record("single_prefill_with_kv_cache", locals())
    out, lse = dense_ref(q[None], k[None], v[None], sm_scale, causal, _fi_window(window_left, causal))
    return (out[0], lse[0]) if return_lse else out[0]


def _paged_requests(kv_cache, indptr, indices, last_page_len):
    """Each request's (keys, values) read through FlashInfer's page metadata (NHD pages)."""
    k_cache, v_cache = kv_cache
    page, ptr = k_cache.shape[1], indptr.tolist()
    out = []
    for i in range(len(ptr) - 1):
        pages = indices[ptr[i]:ptr[i + 1]].tolist()
        length = (len(pages) - 1) * page + int(last_page_len[i])
        out.append((torch.cat([k_cache[j] for j in pages])[:length], torch.cat([v_cache[j] for j in pages])[:length]))
    return out


class BatchDecodeWithPagedKVCacheWrapper:
    """flashinfer 0.7 decode.py: plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
    page_size, *deprecated_positional_args, **kwargs); run(q (N, Hq, D), paged_kv_cache, *, ...)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        assert kv_layout == "NHD"
        self.planned = None
        _record("decode.init", {"use_tensor_cores": use_tensor_cores})

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *deprecated_positional_args, **kwargs):
        assert not deprecated_positional_args
        self.planned = _record("decode.plan", dict(indptr=indptr, indices=indices, last_page_len=last_page_len,
                                                   page_size=page_size, **kwargs))

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=1,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        p = self.planned
        assert paged_kv_cache[0].shape[1] == p["page_size"]
        outs = [dense_ref(q[None, i:i + 1], k[None], v[None], p["sm_scale"], False, None)[0][0]
                for i, (k, v) in enumerate(_paged_requests(paged_kv_cache, p["indptr"], p["indices"], p["last_page_len"]))]
        return _into(out, torch.cat(outs))


class BatchPrefillWithPagedKVCacheWrapper:
    """flashinfer 0.7 prefill.py: plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
    num_qo_heads, num_kv_heads, head_dim_qk, page_size, ..., causal=, sm_scale=, q_data_type=, ...)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                 variant_owns_mask=False):
        assert kv_layout == "NHD"
        _record("prefill.init", {"backend": backend, "jit_args": jit_args, "jit_kwargs": jit_kwargs})
        self.jit_args = jit_args
        self.planned = None

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False,
             uniform_q_len=None):
        self.planned = _record("prefill.plan", {k: v for k, v in locals().items() if k != "self"})

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
            kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=False, uses_spcompress=False):
        p = self.planned
        qo = p["qo_indptr"].tolist()
        reqs = _paged_requests(paged_kv_cache, p["paged_kv_indptr"], p["paged_kv_indices"], p["paged_kv_last_page_len"])
        if self.jit_args is not None and self.jit_args[11] == "AttentionSink":  # run(q, cache, sink, sm_scale)
            sink, scale = args
            window = _fi_window(p["window_left"], p["causal"])
            outs = [naive_attention(q[None, a:b], k[None], v[None], causal=p["causal"], window=window, scale=scale,
                                    sinks=sink)[0] for (a, b), (k, v) in zip(zip(qo[:-1], qo[1:]), reqs, strict=True)]
            return _into(out, torch.cat(outs))
        assert not args
        outs = [dense_ref(q[None, a:b], k[None], v[None], p["sm_scale"], p["causal"], None)[0][0]
                for (a, b), (k, v) in zip(zip(qo[:-1], qo[1:]), reqs, strict=True)]
        return _into(out, torch.cat(outs))


SINK_DECL = {"fa2": "struct AttentionSink /* fa2 */", "fa3": "struct AttentionSink /* fa3 */"}
"""flashinfer.jit.attention.variants.attention_sink_decl: the variant's C++ source per template."""


def determine_attention_backend(device, pos_encoding_mode, use_fp16_qk_reductions, use_custom_mask, dtype_q,
                                dtype_kv, head_dim_qk=None, head_dim_vo=None):
    """flashinfer.utils' template choice, as on Hopper: fa3 unless ALiBi (pos_encoding_mode 2)."""
    return "fa2" if pos_encoding_mode == 2 else "fa3"


def _into(out, result):
    """FlashInfer's ``out=``: the result written into the given buffer (and returned), else a new tensor."""
    if out is None:
        return result
    out.copy_(result)
    return out


class BatchPrefillWithRaggedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None):
        _record("BatchPrefillWithRaggedKVCacheWrapper", {k: v for k, v in locals().items() if k != "self"})
        self.planned = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None,
             seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv=False):
        self.planned = _record("plan", {k: v for k, v in locals().items() if k != "self"})

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None):
        _record("run", {k: v for k, v in locals().items() if k != "self"})
        p = self.planned
        assert p is not None, "plan() must run before run()"
        res, lse_ = varlen_ref(q, k, v, p["qo_indptr"], p["kv_indptr"], p["sm_scale"], p["causal"],
                               _fi_window(p["window_left"], p["causal"]))
        return (res, lse_) if return_lse else res


FA3_TRIMMED = {
    "FLASHATTENTION_DISABLE_BACKWARD": False, "FLASHATTENTION_DISABLE_SPLIT": True,
    "FLASHATTENTION_DISABLE_PAGEDKV": True, "FLASHATTENTION_DISABLE_APPENDKV": True,
    "FLASHATTENTION_DISABLE_LOCAL": True, "FLASHATTENTION_DISABLE_SOFTCAP": True,
    "FLASHATTENTION_DISABLE_PACKGQA": True, "FLASHATTENTION_DISABLE_FP16": False, "FLASHATTENTION_DISABLE_FP8": True,
    "FLASHATTENTION_DISABLE_VARLEN": False, "FLASHATTENTION_DISABLE_CLUSTER": True,
    "FLASHATTENTION_DISABLE_HDIM64": False, "FLASHATTENTION_DISABLE_HDIM96": True,
    "FLASHATTENTION_DISABLE_HDIM128": False, "FLASHATTENTION_DISABLE_HDIM192": True,
    "FLASHATTENTION_DISABLE_HDIM256": True, "FLASHATTENTION_DISABLE_SM8x": True,
    "FLASHATTENTION_ENABLE_VCOLMAJOR": False, "FLASH_ATTENTION_DISABLE_HDIMDIFF64": True,
    "FLASH_ATTENTION_DISABLE_HDIMDIFF192": True}
"""``flash_attn_config.CONFIG["build_flags"]`` of the trimmed FlashAttention-3 3.0.0 wheel (head dims 64/128)."""


# ---- installing them ----------------------------------------------------------------------------
def _module(name: str, version: str = "0.0.0-fake", **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__version__ = version
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def install(monkeypatch, family: str) -> None:
    """Put the fake package of ``family`` into sys.modules (undone by monkeypatch)."""
    CALLS.clear()
    mods = {
        "fa2": {"flash_attn": _module("flash_attn", **{f.__name__: f for f in (
            flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_func,
            flash_attn_varlen_qkvpacked_func)})},
        "fa3": {"flash_attn_interface": _module("flash_attn_interface", flash_attn_func=fa3_flash_attn_func,
                                                flash_attn_varlen_func=fa3_flash_attn_varlen_func)},
        "fa3-trimmed": {"flash_attn_interface": _module("flash_attn_interface", flash_attn_func=fa3_flash_attn_func,
                                                        flash_attn_varlen_func=fa3_flash_attn_varlen_func),
                        "flash_attn_config": _module("flash_attn_config", CONFIG={"build_flags": FA3_TRIMMED})},
        "fa4": {"flash_attn": _module("flash_attn"),
                "flash_attn.cute": _module("flash_attn.cute", flash_attn_func=fa4_flash_attn_func,
                                           flash_attn_varlen_func=fa4_flash_attn_varlen_func)},
        "xformers": _xformers_modules(),
        "sage": {"sageattention": _module("sageattention", sageattn=sageattn, sageattn_varlen=sageattn_varlen)},
        "sage2": {"sageattention": _module("sageattention", **{f.__name__: f for f in (
            sageattn_qk_int8_pv_fp8_cuda, sageattn_qk_int8_pv_fp8_cuda_sm90, sageattn_qk_int8_pv_fp16_cuda)})},
        "sage22": {"sageattention": _module("sageattention", version="2.2.0-fake", sageattn=sageattn_v2, **{
            f.__name__: f for f in (sageattn_qk_int8_pv_fp8_cuda, sageattn_qk_int8_pv_fp8_cuda_sm90,
                                    sageattn_qk_int8_pv_fp16_cuda)})},
        "sparge": {"spas_sage_attn": _module("spas_sage_attn", **{f.__name__: f for f in (
            spas_sage2_attn_meansim_topk_cuda, spas_sage2_attn_meansim_cuda, spas_sage_attn_meansim_topk_cuda,
            spas_sage_attn_meansim_cuda)})},
        "flashinfer": {"flashinfer": _module(
            "flashinfer", single_prefill_with_kv_cache=single_prefill_with_kv_cache,
            BatchPrefillWithRaggedKVCacheWrapper=BatchPrefillWithRaggedKVCacheWrapper,
            BatchDecodeWithPagedKVCacheWrapper=BatchDecodeWithPagedKVCacheWrapper,
            BatchPrefillWithPagedKVCacheWrapper=BatchPrefillWithPagedKVCacheWrapper),
            "flashinfer.jit": _module("flashinfer.jit"), "flashinfer.jit.attention": _module("flashinfer.jit.attention"),
            "flashinfer.jit.attention.variants": _module("flashinfer.jit.attention.variants",
                                                         attention_sink_decl=SINK_DECL),
            "flashinfer.utils": _module("flashinfer.utils", determine_attention_backend=determine_attention_backend)},
    }[family]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    clear_caches()


def clear_caches() -> None:
    """Forget cached import checks and versions (they would outlive the fake modules)."""
    from attnbench.backends.base import _dist_version, _import_reason
    from attnbench.backends.fa3 import build_flags
    _import_reason.cache_clear()
    _dist_version.cache_clear()
    build_flags.cache_clear()


def _xformers_modules() -> dict:
    bias = _module("xformers.ops.fmha.attn_bias", **{c.__name__: c for c in (
        LowerTriangularFromBottomRightMask, LocalAttentionFromBottomRightMask, BlockDiagonalMask,
        BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalLocalAttentionFromBottomRightMask)})
    fmha = _module("xformers.ops.fmha", attn_bias=bias, memory_efficient_attention=memory_efficient_attention)
    ops = _module("xformers.ops", fmha=fmha, memory_efficient_attention=memory_efficient_attention)
    return {"xformers": _module("xformers", ops=ops), "xformers.ops": ops, "xformers.ops.fmha": fmha,
            "xformers.ops.fmha.attn_bias": bias}


"""Calls of FlashMLA's sparse kernels (deepseek-ai/FlashMLA @9241ae3), each returning ``Outputs`` in the layout of
``reference.py``: out (T, Hq, 512), lse and max_logits (Hq, T).

Each function does the work a benchmark must not time (layouts, int32 index lists, padding, scheduling metadata)
once and returns a zero-argument call that runs the kernel alone, like a backend's ``prepare``. ``flash_mla`` is
imported inside, so this module loads without it.

- ``sparse_prefill``: ``flash_mla_sparse_fwd(q (T, Hq, D) bf16, kv (N, 1, D) bf16, indices (T, 1, K) int32, sm_scale,
  d_v, attn_sink, topk_length) -> (out, max_logits (T, Hq), lse (T, Hq))`` (``flash_mla/flash_mla_interface.py:176-
  211``). Hq must be 64 or 128 and D 576 or 512 (``csrc/api/sparse_fwd.h:131-132,190-205``); the Hopper kernel wants K a
  multiple of 128 (``csrc/sm90/prefill/sparse/phase1.cuh:577``), so the lists are padded with −1 (empty slots
  change nothing). A query with no valid slot comes back with lse = +inf (``phase1.cuh:449``).
- ``sparse_decode``: ``flash_mla_with_kvcache(q (b, s_q, Hq, 576), k_cache (pages, page, 1, 656) FP8 rows, None,
  None, 512, sched_meta, None, softmax_scale, causal=False, is_fp8_kvcache=True, indices (b, s_q, K), attn_sink,
  extra_k_cache, extra_indices_in_kvcache, topk_length (b,), extra_topk_length (b,)) -> (out (b, s_q, Hq, 512),
  lse (b, Hq, s_q))`` (``interface.py:53-173``). The cache is the (N, 656) rows of ``fp8.quantize_rows`` cut into
  pages (padded with zero rows to a whole page); an index is then page · page_size + offset, i.e. the row number
  itself. Decode knows only −1 as empty (``csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:632``), so every other empty
  slot is rewritten as −1; lists are padded to a multiple of 64 (``splitkv_mla.cuh:689``). Lengths are per
  request (``csrc/api/sparse_decode.h:307``): the queries of one request must share theirs. On Hopper the V3.2
  layout (D = 576) refuses an extra cache and lengths (``splitkv_mla.cuh:700-701``); FlashMLA tests them only with
  V4's D = 512 layout. The exact reference of a decode call is ``reference_sparse`` over
  ``fp8.dequantize_rows(rows)`` (the kernel computes with exactly those values, ``fp8.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.outputs import Outputs
from attnbench.sparse.fp8 import ROW_BYTES
from attnbench.sparse.reference import LATENT, Selection

PREFILL_SLOTS, DECODE_SLOTS, PAGE = 128, 64, 64
"""Multiples the kernels want of K (prefill on Hopper, decode), and the decode cache's page size."""


def prefill_reason(heads: int, d_qk: int, d_v: int) -> str | None:
    """Why ``flash_mla_sparse_fwd`` refuses a shape, or None."""
    if heads not in (64, 128):
        return f"FlashMLA's sparse prefill takes 64 or 128 query heads, not {heads}"
    if d_qk not in (576, 512) or d_v != LATENT:
        return f"FlashMLA's sparse prefill takes head sizes 576 or 512 with d_v 512, not {d_qk}/{d_v}"
    return None


def pad_slots(indices: torch.Tensor, multiple: int) -> torch.Tensor:
    """(T, K') contiguous int32 index lists, K' the next multiple of ``multiple``, the added slots −1."""
    pad = -indices.shape[1] % multiple
    return torch.nn.functional.pad(indices.to(torch.int32), (0, pad), value=-1).contiguous()


def sparse_prefill(q: torch.Tensor, kv: torch.Tensor, selection: Selection, *, scale: float, d_v: int = LATENT,
                   attn_sink: torch.Tensor | None = None) -> Callable[[], Outputs]:
    """The call of FlashMLA's sparse prefill on q (T, Hq, D) bf16 and kv (N, D) or (N, 1, D) bf16."""
    reason = prefill_reason(q.shape[1], q.shape[2], d_v)
    if reason:
        raise ValueError(reason)
    import flash_mla

    kv3 = kv.reshape(kv.shape[0], 1, kv.shape[-1])
    idx = pad_slots(selection.indices, PREFILL_SLOTS)[:, None, :]
    lengths = None if selection.lengths is None else selection.lengths.to(torch.int32).contiguous()
    sink = None if attn_sink is None else attn_sink.to(torch.float32).contiguous()
    q_in = q.contiguous()

    def call() -> Outputs:
        out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q_in, kv3, idx, scale, d_v, attn_sink=sink,
                                                               topk_length=lengths)
        return Outputs(out=out, lse=lse.T, max_logits=max_logits.T)

    return call


def paged_rows(rows: torch.Tensor, page: int = PAGE) -> torch.Tensor:
    """(pages, page, 1, 656) cache of (N, 656) FP8 rows, the last page padded with zero bytes."""
    if rows.dim() != 2 or rows.shape[1] != ROW_BYTES:
        raise ValueError(f"FP8 rows must be (N, {ROW_BYTES}) bytes, got {tuple(rows.shape)}")
    pad = -rows.shape[0] % page
    full = torch.nn.functional.pad(rows.view(torch.uint8), (0, 0, 0, pad))
    return full.view(-1, page, 1, ROW_BYTES)


def _decode_lists(selection: Selection, rows: int, requests: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((b, s_q, K') int32 with every empty slot −1, lengths (b,) int32 or None)."""
    idx = selection.indices
    idx = pad_slots(torch.where((idx < 0) | (idx >= rows), -1, idx), DECODE_SLOTS)
    lengths = None
    if selection.lengths is not None:
        per = selection.lengths.view(requests, -1)
        if not bool((per == per[:, :1]).all()):
            raise ValueError("FlashMLA's decode takes one length per request: its queries must share it")
        lengths = per[:, 0].to(torch.int32).contiguous()
    return idx.view(requests, -1, idx.shape[-1]), lengths


def sparse_decode(q: torch.Tensor, rows: torch.Tensor, selection: Selection, *, requests: int, scale: float,
                  attn_sink: torch.Tensor | None = None, extra_rows: torch.Tensor | None = None,
                  extra: Selection | None = None, page: int = PAGE) -> Callable[[], Outputs]:
    """The call of FlashMLA's sparse FP8 decode: q (T, Hq, 576) bf16 with T = requests · s_q (request-major), the
    (N, 656) FP8 ``rows`` (``fp8.quantize_rows``), and an extra cache of such rows with its selection."""
    if q.shape[0] % requests:
        raise ValueError(f"{q.shape[0]} queries do not split into {requests} requests")
    import flash_mla

    t, heads, dim = q.shape
    q4 = q.contiguous().view(requests, t // requests, heads, dim)
    cache = paged_rows(rows, page)
    idx, lengths = _decode_lists(selection, rows.shape[0], requests)
    extra_cache = extra_idx = extra_lengths = None
    if extra_rows is not None:
        extra_cache = paged_rows(extra_rows, page)
        extra_idx, extra_lengths = _decode_lists(extra, extra_rows.shape[0], requests)
    sink = None if attn_sink is None else attn_sink.to(torch.float32).contiguous()
    meta, _ = flash_mla.get_mla_metadata()

    def call() -> Outputs:
        out, lse = flash_mla.flash_mla_with_kvcache(
            q4, cache, None, None, LATENT, meta, None, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
            indices=idx, attn_sink=sink, extra_k_cache=extra_cache, extra_indices_in_kvcache=extra_idx,
            topk_length=lengths, extra_topk_length=extra_lengths)
        return Outputs(out=out.reshape(t, heads, out.shape[-1]), lse=lse.transpose(0, 1).reshape(heads, t))

    return call

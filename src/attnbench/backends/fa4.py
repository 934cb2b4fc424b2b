"""FlashAttention-4 (CuTe DSL kernels, module ``flash_attn.cute``, wheel ``flash-attn-4``).

- ``fa4``        flash_attn_func(q, k, v, softmax_scale=, causal=, window_size=(left, right), ..., return_lse=)
- ``fa4-varlen`` flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
- ``fa4-paged``  flash_attn_varlen_func(q, k_pages, v_pages, page_table=, seqused_k=, [cu_seqlens_q=]): a serving
                 step over a paged KV cache (``kvcache.py`` builds it: shuffled pages, a shared prefix's pages
                 shared). Pages of the kernel's key tile (128 tokens at head size 128 on Hopper) load by TMA,
                 other sizes by cp.async; Hopper has no split-KV in FA4, so a small decode batch fills few SMs.

Both return (out, lse). Unbounded window sides are ``None`` here (not -1 as in flash-attn 2/3).

The variants of today's models, forward and backward: sinks as ``learnable_sink`` (float32, one per query
head; the kernel returns their gradient and an LSE that includes them), the softcap as ``softcap``, ALiBi as a
``score_mod`` / ``score_mod_bwd`` pair written in the CuTe DSL (``fa4_mods``) that reads the slopes from an
``aux_tensors`` entry. FA4 takes one score_mod, and its softcap is one, so softcap and ALiBi together are
refused; the ALiBi score_mod sees positions within each sequence, so it takes equal query and key lengths. Its
backward passes the check with as many KV heads as query heads, but returned NaN in 4% of dQ and 38% of dK and dV
under GQA (8 query heads on 2 KV heads, 4.0.0b36, an H100), so ALiBi with GQA is forward only here.

Kernels are JIT-compiled per configuration on first use: the runner's untimed first call in
``prepare`` absorbs that, so it never lands in the timed region. Hopper and Blackwell only.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, _dist_version
from attnbench.backends.kernel import (
    KernelBackend,
    dense_closure,
    effective_window,
    has_param,
    varlen_closure,
)
from attnbench.backends.kvcache import _CAPS as _CACHE_CAPS
from attnbench.backends.kvcache import _KVCacheBackend
from attnbench.inputs import AttnInputs
from attnbench.spec import MAX_PAGE_SIZE, AttnSpec

_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, head_dim_multiple=8,
                     window=True, min_compute_capability=(9, 0), sinks=True, softcap=True, alibi=True)


def fa4_window(spec: AttnSpec) -> tuple[int | None, int | None]:
    """Effective (left, right) with None for an unbounded side (FA4's convention)."""
    if not spec.has_window:
        return (None, None)
    return tuple(None if w < 0 else w for w in effective_window(spec))


def copied_fa4_reason(distribution: str) -> str | None:
    """flash-attn 2's wheel ships FA4's sources as flash_attn/cute (an older copy, untested as FA4): with the
    CUTLASS DSL installed too, it imports. Only the flash-attn-4 wheel counts as FA4."""
    flash_attn_2 = _dist_version("flash-attn")
    if flash_attn_2 is not None and _dist_version(distribution) is None:
        return (f"flash_attn.cute here is the copy inside flash-attn {flash_attn_2}'s wheel, not flash-attn-4 "
                "(the two wheels share the package flash_attn: install flash-attn-4 in its own environment)")
    return None


class _Fa4(KernelBackend):
    package = "flash_attn.cute"
    distribution = "flash-attn-4"
    capabilities = _CAPS

    def unavailable_reason(self) -> str | None:
        return copied_fa4_reason(self.distribution) or super().unavailable_reason()

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.alibi is not None and spec.softcap is not None:
            return "FA4 takes one score_mod and its softcap is one: softcap and ALiBi together are not offered"
        if spec.alibi is not None and spec.seqlens_q != spec.seqlens_k:
            return "the ALiBi score_mod sees positions within each sequence: query and key lengths must match"
        if spec.alibi is not None and spec.gqa and spec.pass_ != "fwd":
            return ("FA4's backward with a score_mod returned NaN gradients under GQA (4.0.0b36 on an H100): "
                    "ALiBi with fewer KV heads runs forward only")
        return None

    def kwargs(self, spec: AttnSpec, fn, device) -> dict:
        kw = {"softmax_scale": spec.softmax_scale, "causal": spec.causal, "window_size": fa4_window(spec)}
        if has_param(fn, "return_lse"):
            kw["return_lse"] = True
        if spec.softcap is not None:
            kw["softcap"] = spec.softcap
        if spec.alibi is not None:
            from attnbench.backends import fa4_mods  # imports the CUTLASS DSL
            kw.update(score_mod=fa4_mods.alibi_score_mod, score_mod_bwd=fa4_mods.alibi_score_mod_bwd,
                      aux_tensors=[torch.tensor(spec.alibi, dtype=torch.float32, device=device)])
        return kw

    def _info(self, spec: AttnSpec, **extra) -> dict:
        return self.base_info() | {"gqa": "native" if spec.gqa else "none", "jit": "compiled on first call"} | extra


class Fa4(_Fa4):
    name = "fa4"
    description = "FlashAttention-4 flash_attn.cute.flash_attn_func (Hopper/Blackwell, bshd)"
    function = "flash_attn_func"

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        kwargs = self.kwargs(spec, fn, inputs.q.device)
        return Prepared(fn=dense_closure(spec, inputs, fn, kwargs, sink_arg="learnable_sink"), info=self._info(spec))


class Fa4Varlen(_Fa4):
    name = "fa4-varlen"
    description = "FlashAttention-4 flash_attn.cute.flash_attn_varlen_func (packed + cu_seqlens)"
    function = "flash_attn_varlen_func"
    capabilities = replace(_CAPS, varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        closure, p = varlen_closure(spec, inputs, fn, self.kwargs(spec, fn, inputs.q.device), sink_arg="learnable_sink")
        return Prepared(fn=closure, info=self._info(spec, flattened_dense=p.batch is not None))


class Fa4Paged(_KVCacheBackend):
    name = "fa4-paged"
    description = "FlashAttention-4 flash_attn_varlen_func over a paged KV cache (page_table + seqused_k)"
    package = _Fa4.package
    distribution = _Fa4.distribution
    function = "flash_attn_varlen_func"
    capabilities = replace(_CACHE_CAPS, head_dim_multiple=8, min_compute_capability=(9, 0), paged=True)
    table_arg = "page_table"
    lengths_arg = "seqused_k"
    mixed_queries = True
    default_sweep = False
    option_ranges = {"page_size": (1, MAX_PAGE_SIZE)}

    def __init__(self, page_size: int = 128):
        self.page_size = int(page_size)

    def unavailable_reason(self) -> str | None:
        return copied_fa4_reason(self.distribution) or super().unavailable_reason()

    def kwargs(self, spec: AttnSpec, inputs: AttnInputs) -> dict:
        # one split: FA4 has no split-KV on Hopper (its interface asserts it)
        return {"softmax_scale": spec.softmax_scale, "causal": spec.causal, "return_lse": True, "num_splits": 1}

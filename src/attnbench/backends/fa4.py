"""FlashAttention-4 (CuTe DSL kernels, module ``flash_attn.cute``, wheel ``flash-attn-4``).

- ``fa4``        flash_attn_func(q, k, v, softmax_scale=, causal=, window_size=(left, right), ..., return_lse=)
- ``fa4-varlen`` flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)

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
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, head_dim_multiple=8,
                     window=True, min_compute_capability=(9, 0), sinks=True, softcap=True, alibi=True)


def fa4_window(spec: AttnSpec) -> tuple[int | None, int | None]:
    """Effective (left, right) with None for an unbounded side (FA4's convention)."""
    if not spec.has_window:
        return (None, None)
    return tuple(None if w < 0 else w for w in effective_window(spec))


class _Fa4(KernelBackend):
    package = "flash_attn.cute"
    distribution = "flash-attn-4"
    capabilities = _CAPS

    def unavailable_reason(self) -> str | None:
        # flash-attn 2's wheel ships FA4's sources as flash_attn/cute (an older copy, untested as FA4): with
        # the CUTLASS DSL installed too, it imports. Only the flash-attn-4 wheel counts as FA4.
        flash_attn_2 = _dist_version("flash-attn")
        if flash_attn_2 is not None and _dist_version(self.distribution) is None:
            return (f"flash_attn.cute here is the copy inside flash-attn {flash_attn_2}'s wheel, not flash-attn-4 "
                    "(the two wheels share the package flash_attn: install flash-attn-4 in its own environment)")
        return super().unavailable_reason()

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

"""FlashAttention-3 (Hopper build of flash-attn, module ``flash_attn_interface``).

- ``fa3``        flash_attn_func(q, k, v, softmax_scale=, causal=, window_size=(left, right), ...)
- ``fa3-varlen`` flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)

Same conventions as flash-attn 2 (bshd / thd, lower-right causal, -1 = unbounded window side). Older
builds always return (out, lse); newer ones return out unless ``return_attn_probs=True``, which is
passed where the signature has it. Needs compute capability 9.0.
"""

from __future__ import annotations

from dataclasses import replace

from attnbench.backends.base import Capabilities, Prepared
from attnbench.backends.kernel import (
    KernelBackend,
    dense_closure,
    effective_window,
    has_param,
    varlen_closure,
)
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, window=True,
                     min_compute_capability=(9, 0))


class _Fa3(KernelBackend):
    package = "flash_attn_interface"
    distribution = "flash_attn_3"
    capabilities = _CAPS

    def kwargs(self, spec: AttnSpec, fn) -> dict:
        kw = {"softmax_scale": spec.softmax_scale, "causal": spec.causal,
              "window_size": effective_window(spec) if spec.has_window else (-1, -1)}
        if has_param(fn, "return_attn_probs"):
            kw["return_attn_probs"] = True
        return kw


class Fa3(_Fa3):
    name = "fa3"
    description = "FlashAttention-3 flash_attn_func (Hopper, bshd)"
    function = "flash_attn_func"

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        return Prepared(fn=dense_closure(spec, inputs, fn, self.kwargs(spec, fn)), info=self.base_info() | {"gqa": "native" if spec.gqa else "none"})


class Fa3Varlen(_Fa3):
    name = "fa3-varlen"
    description = "FlashAttention-3 flash_attn_varlen_func (Hopper, packed + cu_seqlens)"
    function = "flash_attn_varlen_func"
    capabilities = replace(_CAPS, varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        closure, p = varlen_closure(spec, inputs, fn, self.kwargs(spec, fn))
        info = self.base_info() | {"gqa": "native" if spec.gqa else "none", "flattened_dense": p.batch is not None}
        return Prepared(fn=closure, info=info)

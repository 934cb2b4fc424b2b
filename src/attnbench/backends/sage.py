"""SageAttention (package ``sageattention``): INT8 Q/K quantization, forward only, approximate.

- ``sage``            sageattn(q, k, v, tensor_layout="HND"|"NHD", is_causal=, sm_scale=, smooth_k=True)
- ``sage-varlen``     sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      is_causal=, sm_scale=, smooth_k=True)
- ``sage2-fp8``       sageattn_qk_int8_pv_fp8_cuda       (SageAttention2, FP8 PV; sm89+)
- ``sage2-fp8-sm90``  sageattn_qk_int8_pv_fp8_cuda_sm90  (SageAttention2 Hopper kernel)
- ``sage2-fp16``      sageattn_qk_int8_pv_fp16_cuda      (SageAttention2, FP16 PV; sm80+)

Version 1 (the Triton kernels) smooths K by subtracting its mean *in place* (``k -= km``): the
adapter hands those entry points their own copy of K, made in ``prepare`` outside the timed region,
so the caller's inputs never change. Quantization of Q/K (and V for v2) happens inside the kernel
call and is therefore timed (``info["includes_preprocess"] = True``). Dense inputs go in the layout
they are stored in (NHD for bshd, HND for bhsd) so no transpose is added. Causal needs Sq == Sk.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend, device_capability, has_param, packed
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

_V1 = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 96, 128), backward=False,
                   different_v_dim=False, exact=False, min_compute_capability=(8, 0))


class _Sage(KernelBackend):
    package = "sageattention"
    distribution = "sageattention"
    capabilities = _V1
    copies_k = True
    """Give the kernel its own K (version 1 subtracts the K mean in place)."""

    def __init__(self, **options):
        self.options = options
        """Extra keyword arguments for the kernel (e.g. pv_accum_dtype=, qk_quant_gran=, smooth_k=)."""

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.causal and any(sq != sk for sq, sk in spec.sequences):
            return "causal needs equal query and key lengths in SageAttention"
        return None

    def _info(self, fn, **extra) -> dict:
        api = "v1 (smooth_k in place)" if has_param(fn, "smooth_k") and self.copies_k else "v2"
        return self.base_info() | {"includes_preprocess": True, "k_copied": self.copies_k, "api": api,
                                   "options": dict(self.options)} | extra

    def _k(self, k: torch.Tensor) -> torch.Tensor:
        return k.clone() if self.copies_k else k


class _SageDense(_Sage):
    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        hnd = spec.layout == "bhsd"
        kwargs = {"tensor_layout": "HND" if hnd else "NHD", "is_causal": spec.causal, "sm_scale": spec.softmax_scale,
                  **self.options}

        def pre(q, k, v):
            k = self._k(k)
            return tuple(t.transpose(1, 2) for t in (q, k, v)) if hnd else (q, k, v)

        def forward(q, k, v):
            out = fn(q, k, v, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            return out.transpose(1, 2) if hnd else out
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre),
                        info=self._info(fn, tensor_layout=kwargs["tensor_layout"]))


class Sage(_SageDense):
    name = "sage"
    description = "SageAttention sageattn (v1 Triton: INT8 QK, FP16 PV)"
    function = "sageattn"


class SageVarlen(_Sage):
    name = "sage-varlen"
    description = "SageAttention sageattn_varlen (packed + cu_seqlens)"
    function = "sageattn_varlen"
    capabilities = replace(_V1, head_dims=(64, 128), varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, p = self.kernel(), packed(spec, inputs)
        kwargs = {"is_causal": spec.causal, "sm_scale": spec.softmax_scale, **self.options}

        def pre(q, k, v):
            return p.flatten(q), self._k(p.flatten(k)), p.flatten(v)

        def forward(q, k, v):
            out = fn(q, k, v, p.cu_seqlens_q, p.cu_seqlens_k, p.max_seqlen_q, p.max_seqlen_k, **kwargs)
            return p.unflatten(out[0] if isinstance(out, tuple) else out)
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre),
                        info=self._info(fn, flattened_dense=p.batch is not None))


_V2 = replace(_V1, head_dims=None, max_head_dim=128)


class Sage2Fp8(_SageDense):
    name = "sage2-fp8"
    description = "SageAttention2 sageattn_qk_int8_pv_fp8_cuda (INT8 QK, FP8 PV)"
    function = "sageattn_qk_int8_pv_fp8_cuda"
    capabilities = replace(_V2, min_compute_capability=(8, 9))
    copies_k = False


class Sage2Fp8Sm90(_SageDense):
    name = "sage2-fp8-sm90"
    description = "SageAttention2 sageattn_qk_int8_pv_fp8_cuda_sm90 (Hopper kernel)"
    function = "sageattn_qk_int8_pv_fp8_cuda_sm90"
    capabilities = replace(_V2, min_compute_capability=(9, 0))
    copies_k = False

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        cc = device_capability(str(device))
        if cc is not None and cc[0] != 9:
            return f"Hopper-only kernel (compute capability 9.x), device has {cc[0]}.{cc[1]}"
        return super().extra_reason(spec, device)


class Sage2Fp16(_SageDense):
    name = "sage2-fp16"
    description = "SageAttention2 sageattn_qk_int8_pv_fp16_cuda (INT8 QK, FP16 PV)"
    function = "sageattn_qk_int8_pv_fp16_cuda"
    capabilities = _V2
    copies_k = False

"""SpargeAttn (package ``spas_sage_attn``): block-sparse SageAttention, forward only, approximate.

INT8 Q/K with an FP8 PV product (the SageAttention2 kernels, ``spas_sage2_*``):

- ``sparge``           spas_sage2_attn_meansim_topk_cuda(q, k, v, ..., topk=, simthreshd1=, cdfthreshd=, pvthreshd=)
- ``sparge-cdf``       spas_sage2_attn_meansim_cuda(q, k, v, ..., simthreshd1=, cdfthreshd=, pvthreshd=)

INT8 Q/K with an FP16 PV product (the SageAttention 1 based kernels, ``spas_sage_attn_*``):

- ``sparge-fp16``      spas_sage_attn_meansim_topk_cuda(...)   (same knobs as ``sparge``)
- ``sparge-fp16-cdf``  spas_sage_attn_meansim_cuda(...)        (same knobs as ``sparge-cdf``)

All take ``tensor_layout="HND"|"NHD"``, ``scale=``, ``is_causal=`` and, with ``return_sparsity=True``,
return (out, sparsity). The tuning knobs are constructor arguments (``--backend-opt sparge.topk=0.7``);
ones left at None are not passed, so the package's own defaults apply (recorded in ``info["knobs"]``).

Block prediction and quantization run inside the call (timed: ``includes_preprocess``). The sparsity
is read from one untimed call in ``prepare`` (``return_sparsity`` forces a host sync, so the timed
calls do not ask for it); for causal cases the package counts it within the causal triangle.

Causal: the FP16-PV functions hand ``is_causal`` to their kernel, which masks inside the diagonal
blocks. The FP8-PV ones use it only to build the block map and launch the kernel with
``is_causal=False``, so a query would see the later keys of its own diagonal block: those backends
refuse causal cases with that reason.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend, layout_call
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

MIN_SEQ = 128
TOPK_KNOBS = ("topk", "simthreshd1", "cdfthreshd", "pvthreshd")
CDF_KNOBS = ("simthreshd1", "cdfthreshd", "pvthreshd")
FP8_CAUSAL = ("its FP8-PV kernel is launched with is_causal=False (causality only shapes the block map, so "
              "queries would see later keys inside diagonal blocks); use sparge-fp16 or sparge-fp16-cdf")


class _Sparge(KernelBackend):
    package = "spas_sage_attn"
    distribution = "spas_sage_attn"
    install = "build SpargeAttn from source (github.com/thu-ml/SpargeAttn): see docs/backends.md"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128), gqa=False,
                                causal=False, backward=False, cross_lengths=False, different_v_dim=False,
                                exact=False, min_compute_capability=(8, 9))
    knob_names: tuple[str, ...] = ()
    option_ranges = {"topk": (0.0, 1.0), "simthreshd1": (-1.0, 1.0), "cdfthreshd": (0.0, 1.0),
                     "pvthreshd": (0.0, 1e6)}
    """topk and cdfthreshd are fractions, simthreshd1 a cosine similarity; pvthreshd a threshold on the PV
    product's scale (the package uses 20 and 50; 1e6 is far past where it stops skipping anything)."""
    causal_refused: str | None = FP8_CAUSAL
    """Why causal cases are refused; None where the kernel applies the causal mask itself."""

    def __init__(self, **knobs):
        unknown = set(knobs) - set(self.knob_names)
        if unknown:
            raise ValueError(f"{self.name}: unknown knob(s) {sorted(unknown)}; allowed: {', '.join(self.knob_names)}")
        self.knobs = {k: v for k, v in knobs.items() if v is not None}
        """Tuning knobs passed to the kernel (the rest keep the package defaults)."""

    def supports(self, spec: AttnSpec, device) -> str | None:
        if spec.causal and self.causal_refused and self.unavailable_reason() is None:
            return f"causal not offered: {self.causal_refused}"
        return super().supports(spec, device)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if min(spec.seqlens_q + spec.seqlens_k) < MIN_SEQ:
            return f"sequence length must be >= {MIN_SEQ}"
        return None

    def effective_knobs(self, fn) -> dict:
        """Every knob with the value the kernel will use (given, or the signature default)."""
        params = inspect.signature(fn).parameters
        return {k: self.knobs.get(k, params[k].default if k in params else None) for k in self.knob_names}

    def _kwargs(self, spec: AttnSpec) -> dict:
        return {"is_causal": spec.causal, "scale": spec.softmax_scale, "output_dtype": spec.torch_dtype, **self.knobs}

    def functional(self, spec: AttnSpec):
        """fn(q_bshd, k_bshd, v_bshd) -> out_bshd for models: the kernel on the model's own tensors, in the
        layout they are stored in, without asking for the sparsity (which would sync the host)."""
        fn, kwargs = self.kernel(), self._kwargs(spec)
        return lambda q, k, v: layout_call(fn, q, k, v, **kwargs)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        hnd = spec.layout == "bhsd"
        kwargs = {"tensor_layout": "HND" if hnd else "NHD", **self._kwargs(spec)}

        def pre(q, k, v):
            return tuple(t.transpose(1, 2) for t in (q, k, v)) if hnd else (q, k, v)

        def forward(q, k, v):
            out = fn(q, k, v, **kwargs)
            return out.transpose(1, 2) if hnd else out
        with torch.no_grad():
            _, sparsity = fn(*pre(inputs.q, inputs.k, inputs.v), **kwargs, return_sparsity=True)
        info = self.base_info() | {"includes_preprocess": True, "sparsity": float(sparsity),
                                   "knobs": self.effective_knobs(fn), "tensor_layout": kwargs["tensor_layout"]}
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)


class Sparge(_Sparge):
    name = "sparge"
    description = "SpargeAttn spas_sage2_attn_meansim_topk_cuda (top-k block sparsity; INT8 QK, FP8 PV)"
    function = "spas_sage2_attn_meansim_topk_cuda"
    knob_names = TOPK_KNOBS
    compiles_ahead = True  # its first call per shape JIT-compiles Triton kernels (~1.5 s each on an H200 host)


class SpargeCdf(_Sparge):
    name = "sparge-cdf"
    description = "SpargeAttn spas_sage2_attn_meansim_cuda (CDF-threshold block sparsity; INT8 QK, FP8 PV)"
    function = "spas_sage2_attn_meansim_cuda"
    knob_names = CDF_KNOBS
    compiles_ahead = True  # its Triton kernels JIT-compile per shape too (2.2 s a case in the main process on an H100)


class SpargeFp16(_Sparge):
    name = "sparge-fp16"
    description = "SpargeAttn spas_sage_attn_meansim_topk_cuda (top-k block sparsity; INT8 QK, FP16 PV; causal)"
    function = "spas_sage_attn_meansim_topk_cuda"
    knob_names = TOPK_KNOBS
    compiles_ahead = True  # as Sparge: Triton kernels compiled per shape on the first call
    capabilities = replace(_Sparge.capabilities, causal=True, min_compute_capability=(8, 0))
    causal_refused = None


class SpargeFp16Cdf(_Sparge):
    name = "sparge-fp16-cdf"
    description = "SpargeAttn spas_sage_attn_meansim_cuda (CDF-threshold block sparsity; INT8 QK, FP16 PV; causal)"
    function = "spas_sage_attn_meansim_cuda"
    knob_names = CDF_KNOBS
    compiles_ahead = True  # as SpargeCdf
    capabilities = SpargeFp16.capabilities
    causal_refused = None

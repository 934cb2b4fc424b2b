"""SpargeAttn (package ``spas_sage_attn``): block-sparse SageAttention2, forward only, approximate.

- ``sparge``      spas_sage2_attn_meansim_topk_cuda(q, k, v, ..., topk=, simthreshd1=, cdfthreshd=, pvthreshd=, ...)
- ``sparge-cdf``  spas_sage2_attn_meansim_cuda(q, k, v, ..., simthreshd1=, cdfthreshd=, pvthreshd=, ...)

Both take ``tensor_layout="HND"|"NHD"``, ``scale=``, ``output_dtype=`` and, with
``return_sparsity=True``, return (out, sparsity). The tuning knobs are constructor arguments; ones
left at None are not passed, so the package's own defaults apply (recorded in ``info["knobs"]``).
Register a tuned variant with e.g. ``registry.register("sparge-k20", functools.partial(Sparge, topk=0.2))``.

Block prediction and quantization run inside the call (timed: ``includes_preprocess``). The sparsity
is read from one untimed call in ``prepare`` (``return_sparsity`` forces a host sync, so the timed
calls do not ask for it). Causal is not offered: the SageAttention2 sparse kernels are launched
with is_causal=False and rely on the block map alone, which keeps future tokens inside diagonal blocks.
"""

from __future__ import annotations

import inspect

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

MIN_SEQ = 128


class _Sparge(KernelBackend):
    package = "spas_sage_attn"
    distribution = "spas_sage_attn"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128), gqa=False,
                                causal=False, backward=False, cross_lengths=False, different_v_dim=False,
                                exact=False, min_compute_capability=(8, 9))
    knob_names: tuple[str, ...] = ()

    def __init__(self, **knobs):
        unknown = set(knobs) - set(self.knob_names)
        if unknown:
            raise ValueError(f"{self.name}: unknown knob(s) {sorted(unknown)}; allowed: {', '.join(self.knob_names)}")
        self.knobs = {k: v for k, v in knobs.items() if v is not None}
        """Tuning knobs passed to the kernel (the rest keep the package defaults)."""

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if min(spec.seqlens_q + spec.seqlens_k) < MIN_SEQ:
            return f"sequence length must be >= {MIN_SEQ}"
        return None

    def effective_knobs(self, fn) -> dict:
        """Every knob with the value the kernel will use (given, or the signature default)."""
        params = inspect.signature(fn).parameters
        return {k: self.knobs.get(k, params[k].default if k in params else None) for k in self.knob_names}

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        hnd = spec.layout == "bhsd"
        kwargs = {"tensor_layout": "HND" if hnd else "NHD", "is_causal": False, "scale": spec.softmax_scale,
                  "output_dtype": spec.torch_dtype, **self.knobs}

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
    description = "SpargeAttn spas_sage2_attn_meansim_topk_cuda (top-k block sparsity)"
    function = "spas_sage2_attn_meansim_topk_cuda"
    knob_names = ("topk", "simthreshd1", "cdfthreshd", "pvthreshd")


class SpargeCdf(_Sparge):
    name = "sparge-cdf"
    description = "SpargeAttn spas_sage2_attn_meansim_cuda (CDF-threshold block sparsity)"
    function = "spas_sage2_attn_meansim_cuda"
    knob_names = ("simthreshd1", "cdfthreshd", "pvthreshd")

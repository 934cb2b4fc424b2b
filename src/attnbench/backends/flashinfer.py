"""``flashinfer``: FlashInfer prefill kernels, forward only.

- one dense sequence (batch 1): single_prefill_with_kv_cache(q (Sq, Hq, D), k (Sk, Hkv, D), v, causal=,
  kv_layout="NHD", sm_scale=, window_left=);
- batched or varlen: BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD"), whose ``plan``
  (qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=, window_left=, sm_scale=,
  q_data_type=, ...) runs in ``prepare``; only ``run(q, k, v)`` is timed.

FlashInfer aligns causal masks to the lower right like the spec. Its window has a left side only
(``window_left``; the right side is 0 when causal, unbounded otherwise), so windows with a bounded
right side that is not causal are unsupported. Kernels are JIT-built on first use (untimed).
"""

from __future__ import annotations

import importlib

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend, effective_window, has_param, packed
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

WORKSPACE_BYTES = 128 << 20


class FlashInfer(KernelBackend):
    name = "flashinfer"
    description = "FlashInfer single/ragged batch prefill (JIT kernels)"
    package = "flashinfer"
    distribution = "flashinfer-python"
    function = "single_prefill_with_kv_cache"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128, 256), varlen=True,
                                window=True, backward=False, different_v_dim=False, min_compute_capability=(8, 0))

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.has_window and effective_window(spec)[1] not in (-1, 0):
            return "FlashInfer windows bound the left side only (right side must be causal or unbounded)"
        return None

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        # A right side of 0 is FlashInfer's causal flag, also for a non-causal window (left, 0).
        left, right = effective_window(spec)
        if not inputs.varlen and spec.batch == 1:
            return self._single(spec, inputs, left, right == 0)
        return self._ragged(spec, inputs, left, right == 0)

    def _single(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool) -> Prepared:
        fn = self.kernel()
        kwargs = {"causal": causal, "kv_layout": "NHD", "sm_scale": spec.softmax_scale, "window_left": left}

        def pre(q, k, v):  # (1, S, H, D) -> (S, H, D), contiguous (a copy only for bhsd storage)
            return tuple(t[0].contiguous() for t in (q, k, v))

        def forward(q, k, v):
            return fn(q, k, v, **kwargs).unsqueeze(0)
        info = self.base_info() | {"window_left": left}
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)

    def _ragged(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool) -> Prepared:
        mod = importlib.import_module(self.package)
        p = packed(spec, inputs)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=inputs.q.device)
        wrapper = mod.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD")
        head_dim_key = "head_dim_qk" if has_param(wrapper.plan, "head_dim_qk") else "head_dim"
        wrapper.plan(qo_indptr=p.cu_seqlens_q, kv_indptr=p.cu_seqlens_k, num_qo_heads=spec.heads_q,
                     num_kv_heads=spec.heads_kv, **{head_dim_key: spec.head_dim}, causal=causal,
                     window_left=left, sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype,
                     kv_data_type=spec.torch_dtype)

        def forward(q, k, v):
            return p.unflatten(wrapper.run(q, k, v))
        def pre(q, k, v):
            return tuple(p.flatten(t).contiguous() for t in (q, k, v))
        closure = autograd_closure(spec, inputs, forward, pre)
        info = self.base_info() | {"kernel": "flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run",
                                   "window_left": left, "flattened_dense": p.batch is not None}
        return Prepared(fn=closure, info=info)

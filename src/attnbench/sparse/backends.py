"""Backends of index-selected MLA cases (``Backend.operator = "sparse-mla"``).

- ``sparse-torch``: each query's rows gathered and attended in PyTorch in the case's dtype
  (``baseline.baseline_sparse``, the check's yardstick), forward and backward; any device.
- ``flashmla-sparse``: FlashMLA's sparse prefill, ``flash_mla_sparse_fwd`` (bf16, 64 or 128 heads, sink and
  per-query lengths; no extra cache, no backward) (``flashmla.sparse_prefill``).
- ``flashmla-sparse-fp8``: FlashMLA's sparse FP8 decode, ``flash_mla_with_kvcache(indices=...,
  is_fp8_kvcache=True)`` over V3.2's 656-byte rows, paged (``flashmla.sparse_decode``); on Hopper this layout
  takes a sink but neither an extra cache nor lengths.
"""

from __future__ import annotations

from attnbench.backends.base import Backend, Capabilities, Prepared, device_type
from attnbench.sparse import flashmla
from attnbench.sparse.baseline import baseline_sparse
from attnbench.sparse.spec import SparseSpec


class _SparseBackend(Backend):
    operator = "sparse-mla"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), backward=True)

    def supports(self, spec: SparseSpec, device) -> str | None:
        if getattr(spec, "operator", None) != self.operator:
            return super().supports(spec, device)
        if (why := self.unavailable_reason()) is not None:
            return why
        dev = device_type(device)
        if dev not in self.capabilities.devices:
            return f"runs on {'/'.join(self.capabilities.devices)}, not {dev}"
        if spec.dtype not in self.capabilities.dtypes:
            return f"{spec.dtype} not supported (takes {', '.join(self.capabilities.dtypes)})"
        if spec.pass_ != "fwd" and not self.capabilities.backward:
            return "forward only (no backward kernel)"
        return self.extra_reason(spec, device)

    def judged_exactly(self, spec) -> bool:
        return True


class SparseTorch(_SparseBackend):
    name = "sparse-torch"
    description = "index-selected MLA in PyTorch: each query's rows gathered, attended in the case's dtype"

    def prepare(self, spec, inputs) -> Prepared:
        dout = inputs.dout if spec.pass_ == "fwd_bwd" else None
        return Prepared(fn=lambda: baseline_sparse(inputs.q, inputs.kv, inputs.selection, **inputs.kwargs(spec),
                                                   dout=dout), info={"kernel": "gather + matmul (torch)"})


class _FlashMla(_SparseBackend):
    package = "flash_mla"
    distribution = "flash-mla"
    install = "build deepseek-ai/FlashMLA (pip install --no-build-isolation .) for sm90"
    capabilities = Capabilities(dtypes=("bf16",), backward=False, devices=("cuda",), min_compute_capability=(9, 0))

    def extra_reason(self, spec, device) -> str | None:
        import torch
        if torch.cuda.get_device_capability(device)[0] != 9:
            return "these FlashMLA kernels are built for sm90 here"
        return None


class FlashMlaSparse(_FlashMla):
    name = "flashmla-sparse"
    description = "FlashMLA's sparse prefill, flash_mla_sparse_fwd (bf16 cache, 64/128 heads)"

    def extra_reason(self, spec, device) -> str | None:
        if spec.decode:
            return "reads a bf16 cache, not FP8 rows (flashmla-sparse-fp8 does)"
        if spec.extra is not None:
            return "no extra cache in FlashMLA's sparse prefill (decode only)"
        return flashmla.prefill_reason(spec.heads, spec.d_qk, spec.d_v) or super().extra_reason(spec, device)

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=flashmla.sparse_prefill(inputs.q, inputs.kv, inputs.selection, scale=spec.scale,
                                                   d_v=spec.d_v, attn_sink=inputs.attn_sink),
                        info={"kernel": "flash_mla.flash_mla_sparse_fwd"})


class FlashMlaSparseFp8(_FlashMla):
    name = "flashmla-sparse-fp8"
    description = "FlashMLA's sparse FP8 decode over V3.2's 656-byte rows, paged (flash_mla_with_kvcache)"

    def extra_reason(self, spec, device) -> str | None:
        if not spec.decode:
            return "reads V3.2's FP8 rows: a --decode case"
        if spec.extra is not None or spec.topk_length:
            return "V3.2's FP8 layout takes no extra cache and no lengths on Hopper (V4's 512-wide layout does)"
        return super().extra_reason(spec, device)

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=flashmla.sparse_decode(inputs.q, inputs.rows, inputs.selection, requests=spec.batch,
                                                  scale=spec.scale, attn_sink=inputs.attn_sink),
                        info={"kernel": "flash_mla.flash_mla_with_kvcache (sparse, fp8)"})

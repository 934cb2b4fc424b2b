"""Backends of index-selected MLA cases (``Backend.operator = "sparse-mla"``).

- ``sparse-torch``: each query's rows gathered and attended in PyTorch as a careful kernel does in the case's dtype
  (fp32 accumulators and softmax; ``baseline.baseline_sparse``, the check's yardstick), forward and backward; any
  device.
- ``flashmla-sparse``: FlashMLA's sparse prefill, ``flash_mla_sparse_fwd`` (bf16, 64 or 128 heads, sink and
  per-query lengths; no extra cache, no backward) (``flashmla.sparse_prefill``).
- ``flashmla-sparse-fp8``: FlashMLA's sparse FP8 decode, ``flash_mla_with_kvcache(indices=...,
  is_fp8_kvcache=True)`` over V3.2's 656-byte rows, paged (``flashmla.sparse_decode``); on Hopper this layout
  takes a sink but neither an extra cache nor lengths.
- ``flashinfer-sparse-mla``: FlashInfer 0.7.2.post1's ``dsa_sparse_attention`` (bf16, 64 heads, lengths, forward
  and backward; no sink, no extra cache; sm100/sm103/sm107 only) (``sparse/flashinfer.py``; written against its
  source, untested on hardware).
"""

from __future__ import annotations

import warnings

import torch

from attnbench.backends.base import Backend, BackendUnavailable, Capabilities, Prepared, device_type
from attnbench.outputs import Outputs
from attnbench.sparse import flashinfer as fi
from attnbench.sparse import flashmla
from attnbench.sparse.baseline import baseline_sparse


class _SparseBackend(Backend):
    operator = "sparse-mla"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), backward=True)


class SparseTorch(_SparseBackend):
    name = "sparse-torch"
    description = "index-selected MLA in PyTorch: each query's rows gathered, fp32 accumulators and softmax"

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


class FlexSparse(_SparseBackend):
    """FlexAttention with a mask over the index set, as a user writes it: each request's (queries, rows) boolean
    grid of the selected slots (main cache, then the extra cache appended to its keys) turned into a block mask,
    the value the first d_v dims of each row, the one KV head shared through ``enable_gqa``; a sink as the sinks
    feature does it, ``out · σ(lse − sink)``. A mask names a key once: a case whose index lists repeat a row is
    refused (FlashMLA counts a slot each time). Compiled on a GPU (its first call in ``prepare``), eager on the
    CPU (``compile=False``: an unfused reference that materialises the scores)."""

    name = "flex-sparse-mla"
    description = "FlexAttention with a block mask over the selected slots (compiled on a GPU)"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), backward=True)

    def __init__(self, compile: bool | None = None):
        self.compile = compile

    def build_limit(self, exc: BaseException) -> str | None:
        """Inductor finds no Triton tiling of MLA's 576-wide rows (on an H200 with torch 2.11: "No valid triton
        configs" (out of shared memory) at 128 heads, "No choices to select" at 16): the compiled kernel cannot
        take the case, which is not a wrong result."""
        text = str(exc)
        for words in ("No valid triton configs", "No choices to select"):  # the two forms inductor's refusal takes
            if words in text:
                return f"FlexAttention's compiled kernel has no Triton config for rows of this width (inductor: {words})"
        return None

    def extra_reason(self, spec, device) -> str | None:
        if spec.pass_ != "fwd" and device_type(device) == "cpu":
            return "FlexAttention has no backward on the CPU"
        if spec.repeats:
            return "a mask names a key once: it cannot count a row that two slots of a query repeat"
        return None

    def workspace_bytes(self, spec, device="cpu") -> int:
        """Bytes beyond the inputs, for the memory guard: uncompiled (the CPU), FlexAttention's math expands the
        one KV head's rows to every query head, in the dtype and again in fp32 (peak RSS on a CPU: 2.9x the bf16
        expansion), and holds the scores in fp32 (three copies); compiled, a fused kernel (none)."""
        if self.compile if self.compile is not None else device_type(device) == "cuda":
            return 0
        keys = spec.s_kv + (spec.extra[0] if spec.extra else 0)
        elem = 2 if spec.dtype != "fp32" else 4
        expanded = spec.batch * spec.heads * keys * (spec.d_qk + spec.d_v) * (elem + 4)
        return expanded + 3 * 4 * spec.batch * spec.heads * spec.s_q * keys

    def prepare(self, spec, inputs) -> Prepared:
        import time

        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        from attnbench.backends.flex import compiled_flex, flex_with_lse
        device = inputs.q.device
        compiled = self.compile if self.compile is not None else device.type == "cuda"
        b, sq = spec.batch, spec.s_q
        rows = [(inputs.kv, inputs.selection, spec.s_kv)]
        if inputs.extra is not None:
            rows.append((inputs.extra_kv, inputs.extra, spec.extra[0]))
        keys = sum(n for _, _, n in rows)
        allowed = torch.zeros(b * sq, keys, dtype=torch.bool, device=device)
        kv_parts, offset = [], 0
        for cache, sel, per in rows:
            valid = sel.valid(cache.shape[0])
            req = (torch.arange(b * sq, device=device) // sq)[:, None]
            local = (sel.indices.long() - req * per).clamp(0, per - 1) + offset
            counts = torch.zeros_like(allowed, dtype=torch.int32).scatter_add_(1, local, valid.int())
            if bool((counts > 1).any()):
                raise BackendUnavailable("a row named by two slots of one query: a mask counts it once")
            allowed |= counts > 0
            kv_parts.append(cache.view(b, per, -1))
            offset += per
        grid = allowed.view(b, sq, keys)
        kv = torch.cat(kv_parts, dim=1)[:, None]  # (B, 1, keys, D)
        k = kv
        q = inputs.q.view(b, sq, spec.heads, spec.d_qk).transpose(1, 2)
        mask = create_block_mask(lambda bb, h, qi, ki: grid[bb, qi, ki], b, None, sq, keys, device=device)
        fn = compiled_flex("inductor", None) if compiled else flex_attention
        sink = inputs.attn_sink
        grads = spec.pass_ == "fwd_bwd"

        def forward(q, k, v, sink):
            with warnings.catch_warnings():  # eager by choice (the CPU): torch's advice to compile is not news
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                out, lse = flex_with_lse(fn, q, k, v, dict(block_mask=mask, scale=spec.scale, enable_gqa=True))
            if sink is not None:  # a query with no valid slot keeps its 0 output (lse -inf: the sigmoid gives 0)
                out = out * torch.sigmoid(lse - sink[None, :, None]).to(out.dtype)[..., None]
            return out, lse

        def call() -> Outputs:
            leaves = {"q": q, "kv": k, "attn_sink": sink}
            if grads:
                leaves = {n: None if t is None else t.detach().requires_grad_() for n, t in leaves.items()}
            with torch.set_grad_enabled(grads):
                out, lse = forward(leaves["q"], leaves["kv"], leaves["kv"][..., :spec.d_v], leaves["attn_sink"])
            o = out.transpose(1, 2).reshape(b * sq, spec.heads, spec.d_v)
            result = Outputs(out=o.detach(), lse=lse.transpose(0, 1).reshape(spec.heads, b * sq).detach())
            if grads:
                names = [n for n, t in leaves.items() if t is not None]
                got = torch.autograd.grad(o, [leaves[n] for n in names], inputs.dout)
                for n, g in zip(names, got):
                    result["d" + n] = g
                result["dq"] = result["dq"].transpose(1, 2).reshape(b * sq, spec.heads, spec.d_qk)
                dkv = result["dkv"][:, 0]  # (B, keys, D): the main cache's rows, then the extra's
                result["dkv"] = dkv[:, :spec.s_kv].reshape(b * spec.s_kv, -1)
                if inputs.extra is not None:
                    result["dextra_kv"] = dkv[:, spec.s_kv:].reshape(b * spec.extra[0], -1)
            return result

        started = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        first = (time.perf_counter() - started) * 1e3
        return Prepared(fn=call, info={"kernel": "flex_attention (block mask of the index set)",
                                       "compiled": compiled, ("compile_ms" if compiled else "first_call_ms"): first})


class FlashInferSparseMla(_SparseBackend):
    name = "flashinfer-sparse-mla"
    description = "FlashInfer's DSA sparse attention, dsa_sparse_attention (bf16, 64 heads, sm100/sm103/sm107)"
    package = "flashinfer"
    distribution = "flashinfer-python"
    install = "pip install flashinfer-python==0.7.2.post1"
    capabilities = Capabilities(dtypes=("bf16",), backward=True, devices=("cuda",))

    def extra_reason(self, spec, device) -> str | None:  # the package and the device: Backend.supports
        return fi.case_reason(spec) or fi.arch_reason(torch.cuda.get_device_capability(torch.device(device)))

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=fi.prepare(spec, inputs), info={"kernel": fi.KERNEL})

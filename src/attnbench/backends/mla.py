"""Multi-head latent attention (DeepSeek-V3, Kimi K2) decode with absorbed weights, over a paged latent cache.

A case with ``spec.mla``: queries of ``head_dim`` = 576 (the latent part, 512, then the rope part, 64), one cached
row of 576 per token shared by every query head (``heads_kv`` = 1), and the value is the row's first 512 dims.
Each request has the same number of new queries (1 for decode, up to 4 for speculative decoding), causal at the
lower right. ``prepare`` builds the cache from the case's keys (``kvcache.build_cache``: pages handed out in a
shuffled order, 64 tokens a page unless the case names another size) and whatever the kernel plans; only the
kernel call is timed. The softmax scale is the case's: DeepSeek's is 1/√192, not the kernels' default 1/√576
(``--softmax-scale``, or ``--preset deepseek-v3``).

- ``flashmla``: deepseek-ai/FlashMLA's dense decode, ``flash_mla_with_kvcache(q (N, s_q, H, 576), k_cache
  (pages, 64, 1, 576), block_table, cache_seqlens, 512, sched_meta, softmax_scale=, causal=)``; its scheduling
  metadata (``get_mla_metadata()``, filled in by the first call) is made in ``prepare``. bf16/fp16, 64-token pages.
- ``fa3-mla``: FlashAttention-3's ``flash_attn_with_kvcache(q=q_rope, k_cache=rope cache, v_cache=latent cache,
  qv=q_latent, page_table=, cache_seqlens=)``: the rope parts as q and k (64), the latent part of the query as
  ``qv`` against the latent cache, which is also the value (needs a build with the 64/512 head-dim pair, such as
  the serving wheel). The rope and latent caches are two tensors, built in ``prepare``.
- ``flashinfer-mla``: FlashInfer's ``BatchMLAPagedAttentionWrapper(workspace, backend=)`` with ``plan(qo_indptr,
  kv_indptr, kv_indices, kv_len_arr, num_heads, 512, 64, page_size, causal, sm_scale, q_dtype, kv_dtype)`` in
  ``prepare`` (its seconds in ``info["plan_ms"]``) and ``run(q_latent, q_rope, latent_cache, rope_cache)``;
  ``--backend-opt flashinfer-mla.backend=fa2|fa3``.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Outputs, Prepared
from attnbench.backends.fa3 import Fa3Build, build_flags
from attnbench.backends.kernel import KernelBackend, packed
from attnbench.backends.kvcache import append_call, build_cache, request_outputs
from attnbench.inputs import AttnInputs
from attnbench.spec import MAX_PAGE_SIZE, AttnSpec

LATENT, ROPE = 512, 64
"""DeepSeek-V3's latent (value) and rope widths: a cached row is LATENT + ROPE = 576 wide."""
_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(LATENT + ROPE,),
                     max_head_dim=LATENT + ROPE, varlen=True, backward=False, min_compute_capability=(9, 0), paged=True)


class _MLABackend(KernelBackend):
    """Common checks and the latent cache; subclasses plan and call their kernel."""

    default_sweep = False
    capabilities = _CAPS
    page_size = 64
    option_ranges = {"page_size": (1, MAX_PAGE_SIZE)}

    def page(self, spec: AttnSpec) -> int:
        return spec.page_size or self.page_size

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if not spec.mla:
            return "takes MLA cases (--mla: the value is the latent part of the key row)"
        if spec.head_dim_v != LATENT or spec.heads_kv != 1:
            return f"takes DeepSeek's MLA shape: one KV head, value head size {LATENT} of {LATENT + ROPE}"
        if len(set(spec.seqlens_q)) != 1:
            return "every request needs the same number of new queries"
        if any(sq > sk for sq, sk in zip(spec.seqlens_q, spec.seqlens_k)):
            return "more new queries than cached keys"
        return None

    def latent_cache(self, spec: AttnSpec, inputs: AttnInputs):
        """(packed view, keys-only paged cache, queries (N, s_q, H, 576), the write of the step's new latent rows:
        ``kvcache.append_call``, as ``Prepared.side``)."""
        p = packed(spec, inputs)
        k = p.flatten(inputs.k)
        cache = build_cache(k, None, p.seqlens_k, self.page(spec), seed=inputs.seed)
        n, sq = len(p.seqlens_q), p.seqlens_q[0]
        q = p.flatten(inputs.q).reshape(n, sq, *inputs.q.shape[-2:])
        return p, cache, q, {"append": append_call(cache, p, k, None, inputs, self.page(spec))}

    def info(self, spec: AttnSpec, cache) -> dict:
        return self.base_info() | {"cache": f"paged latent rows of {LATENT + ROPE}, {self.page(spec)} tokens a page",
                                   "cache_mib": round(cache.k_cache.numel() * cache.k_cache.element_size() / 2**20, 3)}


class FlashMLA(_MLABackend):
    name = "flashmla"
    description = "FlashMLA dense decode (flash_mla_with_kvcache), paged latent cache of 64-token pages"
    package = "flash_mla"
    distribution = "flash-mla"
    function = "flash_mla_with_kvcache"
    install = ("build it from github.com/deepseek-ai/FlashMLA with its pinned CUTLASS (FLASH_MLA_DISABLE_SM100=1 "
               "pip install . --no-build-isolation)")

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if self.page(spec) != 64:
            return f"FlashMLA takes pages of 64 tokens, not {self.page(spec)}"
        return super().extra_reason(spec, device)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod = importlib.import_module(self.package)
        p, cache, q, side = self.latent_cache(spec, inputs)
        meta = mod.get_mla_metadata()[0]  # filled in by the first call (the scheduling FlashMLA plans)

        def call() -> Outputs:
            with torch.no_grad():
                out, lse = mod.flash_mla_with_kvcache(q, cache.k_cache, cache.block_table, cache.cache_seqlens,
                                                      spec.head_dim_v, meta, None, softmax_scale=spec.softmax_scale,
                                                      causal=spec.causal)
            return request_outputs(p, out, lse)
        start = time.perf_counter()
        call()  # plans (sched_meta) and warms up, untimed
        torch.cuda.synchronize(inputs.q.device)
        info = self.info(spec, cache) | {"first_call_ms": round((time.perf_counter() - start) * 1e3, 3)}
        return Prepared(fn=call, info=info, side=side)


class Fa3MLA(Fa3Build, _MLABackend):
    name = "fa3-mla"
    description = "FlashAttention-3 flash_attn_with_kvcache with qv (MLA decode: rope as q/k, latent as qv/v)"
    package = "flash_attn_interface"
    distribution = "flash_attn_3"
    function = "flash_attn_with_kvcache"
    install = "build it from flash-attention's hopper/ folder with the 64/512 head-dim pair (the serving wheel has it)"
    declared = _CAPS

    @property
    def capabilities(self) -> Capabilities:
        # the build's head-size kernels are not this path's: it runs the 64-wide rope part as q/k with the latent
        # as qv (the HDIMDIFF64 kernels, checked below), not a 576-wide head
        return replace(super().capabilities, max_head_dim=_CAPS.max_head_dim)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        flags = build_flags()
        for flag in ("FLASH_ATTENTION_DISABLE_HDIMDIFF64", "FLASHATTENTION_DISABLE_PAGEDKV"):  # setup.py's spellings
            if flags.get(flag):
                return f"this FlashAttention-3 build was made with {flag}"
        return _MLABackend.extra_reason(self, spec, device)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        p, cache, q, side = self.latent_cache(spec, inputs)
        latent, rope = cache.k_cache[..., :LATENT].contiguous(), cache.k_cache[..., LATENT:].contiguous()
        q_latent, q_rope = q[..., :LATENT].contiguous(), q[..., LATENT:].contiguous()
        kwargs = {"qv": q_latent, "page_table": cache.block_table, "cache_seqlens": cache.cache_seqlens,
                  "softmax_scale": spec.softmax_scale, "causal": spec.causal, "return_softmax_lse": True}

        def call() -> Outputs:
            with torch.no_grad():
                out, lse = fn(q_rope, rope, latent, **kwargs)[:2]
            return request_outputs(p, out, lse)
        return Prepared(fn=call, info=self.info(spec, cache) | {"split": "rope (q, k) 64 + latent (qv, v) 512"},
                        side=side)


class FlashInferMLA(_MLABackend):
    name = "flashinfer-mla"
    description = "FlashInfer BatchMLAPagedAttentionWrapper (MLA decode over a paged latent cache; JIT kernels)"
    package = "flashinfer"
    distribution = "flashinfer-python"
    function = "BatchMLAPagedAttentionWrapper"
    compiles_ahead = True

    def __init__(self, page_size: int = 64, backend: str = "auto"):
        self.page_size = int(page_size)
        if backend not in ("auto", "fa2", "fa3"):
            raise ValueError(f"backend must be auto, fa2 or fa3, got {backend!r}")
        self.backend = backend

    def kernel(self):
        return getattr(importlib.import_module(f"{self.package}.mla"), self.function)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        from attnbench.backends.flashinfer import WORKSPACE_BYTES, first_call, page_metadata, timed_plan
        device = inputs.q.device
        p, cache, q, side = self.latent_cache(spec, inputs)
        page = self.page(spec)
        indptr, indices, _ = page_metadata(cache.block_table, p.seqlens_k, page)
        latent = cache.k_cache[..., :LATENT].squeeze(2).contiguous()  # (pages, page, 512)
        rope = cache.k_cache[..., LATENT:].squeeze(2).contiguous()
        heads = spec.heads_q
        q_latent = q[..., :LATENT].reshape(-1, heads, LATENT).contiguous()
        q_rope = q[..., LATENT:].reshape(-1, heads, ROPE).contiguous()
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = self.kernel()(workspace, backend=self.backend)
        plan_ms = timed_plan(lambda: wrapper.plan(p.cu_seqlens_q, indptr, indices, cache.cache_seqlens, heads, LATENT,
                                                  ROPE, page, spec.causal, spec.softmax_scale, spec.torch_dtype,
                                                  spec.torch_dtype), device)
        n, sq = q.shape[:2]

        def call() -> Outputs:
            with torch.no_grad():
                out = wrapper.run(q_latent, q_rope, latent, rope)
            return Outputs(out=p.unflatten(out.reshape(n * sq, heads, LATENT)))
        info = self.info(spec, cache) | {"template": self.backend}
        prepared = first_call(Prepared(fn=call, info=info, side=side), device)
        prepared.info["plan_ms"] = round(plan_ms, 4)
        return prepared

"""``flashinfer``: FlashInfer prefill kernels, forward only.

- one dense sequence (batch 1): single_prefill_with_kv_cache(q (Sq, Hq, D), k (Sk, Hkv, D), v, causal=,
  kv_layout="NHD", sm_scale=, window_left=);
- batched or varlen: BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD"), whose ``plan``
  (qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=, window_left=, sm_scale=,
  q_data_type=, ...) runs in ``prepare``; only ``run(q, k, v)`` is timed.

``--backend-opt flashinfer.backend=fa2|fa3`` pins FlashInfer's kernel template (default ``auto``: its own
choice, the FA3 template on Hopper where it applies); the record's ``info["template"]`` says which was asked
and ``info["template_ran"]`` which FlashInfer chose (its ``auto`` falls back to FA2 for ALiBi).

The variants of today's models, forward only:
- softcap: ``logits_soft_cap=c`` (``c·tanh(s/c)`` of the scaled scores, as attnbench defines it);
- ALiBi: ``pos_encoding_mode="ALIBI"`` with FlashInfer's own slopes (the standard ones; other slopes are
  refused). Its bias is ``slope·(j − i)`` with ``i`` not aligned to the lower right: the same softmax as
  attnbench's, whose bias differs by a constant per row. It applies the softcap after the bias (and scales
  the scores twice), so softcap and ALiBi together are refused;
- sinks: ``BatchAttentionWithAttentionSinkWrapper`` (a paged-KV prefill wrapper) over pages of one token,
  which is the contiguous K and V viewed as (tokens, 1, heads, dim): no copy. ``run(q, (k, v), sinks,
  sm_scale)``. FlashInfer's ordinary wrappers accept a ``sinks=`` argument too, but not every template applies
  it, so they are not used for sinks.

FlashInfer aligns causal masks to the lower right like the spec. Its window has a left side only
(``window_left``; the right side is 0 when causal, unbounded otherwise), so windows with a bounded
right side that is not causal are unsupported.

Kernels are JIT-built with nvcc on first use (about 20 s for a decode module, about 2 min for an sm90
prefill module on an H100 host; cached under ``~/.cache/flashinfer``). ``prepare`` calls the kernel
once and records that call's seconds as ``info["first_call_s"]`` (the build, when the module was not
cached yet); the backends compile ahead (``precompile``), so in a sweep the builds run in worker
processes while other cases are timed, and never inside a timed call.

- ``flashinfer-decode`` BatchDecodeWithPagedKVCacheWrapper, one new query per request, paged KV cache
  (``--backend-opt flashinfer-decode.use_tensor_cores=true``: FlashInfer's tensor-core decode kernel);
- ``flashinfer-paged``  BatchPrefillWithPagedKVCacheWrapper, new queries (prefill with a prefix cache, or
  several decode queries) over a paged KV cache; both take ``--backend-opt NAME.page_size=N`` (default 16).
"""

from __future__ import annotations

import importlib
import time

import torch

from attnbench.backends.base import Capabilities, Outputs, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend, effective_window, has_param, packed
from attnbench.backends.kvcache import MAX_PAGE_SIZE
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec
from attnbench.variants import alibi_label

WORKSPACE_BYTES = 128 << 20


def first_call(prepared: Prepared, device: torch.device) -> Prepared:
    """Call the kernel once (building its JIT module if not cached) and record the seconds that took."""
    start = time.perf_counter()
    prepared.fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prepared.info["first_call_s"] = round(time.perf_counter() - start, 3)
    return prepared


class FlashInfer(KernelBackend):
    name = "flashinfer"
    description = "FlashInfer single/ragged batch prefill (JIT kernels)"
    package = "flashinfer"
    distribution = "flashinfer-python"
    function = "single_prefill_with_kv_cache"
    compiles_ahead = True
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128, 256), varlen=True,
                                window=True, backward=False, different_v_dim=False, min_compute_capability=(8, 0),
                                sinks=True, softcap=True, alibi=True)

    TEMPLATES = ("auto", "fa2", "fa3")

    def __init__(self, backend: str = "auto"):
        if backend not in self.TEMPLATES:
            raise ValueError(f"backend must be one of {', '.join(self.TEMPLATES)}, got {backend!r}")
        self.backend = backend
        """FlashInfer's kernel template: ``auto`` (its choice: fa3 on Hopper where supported), ``fa2``, ``fa3``."""

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.has_window and effective_window(spec)[1] not in (-1, 0):
            return "FlashInfer windows bound the left side only (right side must be causal or unbounded)"
        if spec.alibi is not None and alibi_label(spec.alibi) != "alibi":
            return "FlashInfer's ALiBi takes its own slopes (the standard ones of the head count), not given ones"
        if spec.alibi is not None and spec.softcap is not None:
            return "FlashInfer applies its softcap after the ALiBi bias (scaling twice): not this attention"
        if spec.sinks and (spec.softcap is not None or spec.alibi is not None):
            return "FlashInfer's sink wrapper has no softcap or ALiBi"
        if spec.alibi is not None and self.backend == "fa3":
            return "FlashInfer's FA3 template has no ALiBi (its FA2 template has)"
        return None

    def variant_kwargs(self, spec: AttnSpec) -> dict:
        """The softcap and ALiBi arguments of FlashInfer's prefill calls and plans."""
        kw = {}
        if spec.softcap is not None:
            kw["logits_soft_cap"] = spec.softcap
        if spec.alibi is not None:
            kw["pos_encoding_mode"] = "ALIBI"
        return kw

    def template_ran(self, spec: AttnSpec, device) -> str:
        """The template FlashInfer's ``auto`` picks for the case (its own rule), or the pinned one."""
        if self.backend != "auto":
            return self.backend
        try:
            utils = importlib.import_module(f"{self.package}.utils")
            mode = 2 if spec.alibi is not None else 0  # PosEncodingMode: NONE 0, ROPE_LLAMA 1, ALIBI 2
            return utils.determine_attention_backend(torch.device(device), mode, False, False, spec.torch_dtype,
                                                     spec.torch_dtype, head_dim_qk=spec.head_dim,
                                                     head_dim_vo=spec.head_dim_v)
        except (ImportError, AttributeError, TypeError):  # another FlashInfer version: say so rather than guess
            return "unknown"

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        # A right side of 0 is FlashInfer's causal flag, also for a non-causal window (left, 0).
        left, right = effective_window(spec)
        if spec.sinks:
            prepared = self._sinks(spec, inputs, left, right == 0)
        elif not inputs.varlen and spec.batch == 1:
            prepared = self._single(spec, inputs, left, right == 0)
        else:
            prepared = self._ragged(spec, inputs, left, right == 0)
        prepared.info["template_ran"] = self.template_ran(spec, inputs.q.device)
        return first_call(prepared, inputs.q.device)

    def _single(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool) -> Prepared:
        fn = self.kernel()
        kwargs = {"causal": causal, "kv_layout": "NHD", "sm_scale": spec.softmax_scale, "window_left": left,
                  **self._backend_kwarg(fn), **self.variant_kwargs(spec)}

        def pre(q, k, v):  # (1, S, H, D) -> (S, H, D), contiguous (a copy only for bhsd storage)
            return tuple(t[0].contiguous() for t in (q, k, v))

        def forward(q, k, v):
            return fn(q, k, v, **kwargs).unsqueeze(0)
        info = self.base_info() | {"window_left": left, "template": self.backend}
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)

    def _backend_kwarg(self, fn) -> dict:
        """``backend=`` for FlashInfer versions that take it (0.2 on); a pinned template needs it."""
        if self.backend == "auto":
            return {}
        if not has_param(fn, "backend"):
            raise RuntimeError(f"this flashinfer has no backend= to pin the {self.backend} template")
        return {"backend": self.backend}

    def _ragged(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool) -> Prepared:
        mod = importlib.import_module(self.package)
        p = packed(spec, inputs)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=inputs.q.device)
        wrapper = mod.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD",
                                                           **self._backend_kwarg(mod.BatchPrefillWithRaggedKVCacheWrapper))
        head_dim_key = "head_dim_qk" if has_param(wrapper.plan, "head_dim_qk") else "head_dim"
        wrapper.plan(qo_indptr=p.cu_seqlens_q, kv_indptr=p.cu_seqlens_k, num_qo_heads=spec.heads_q,
                     num_kv_heads=spec.heads_kv, **{head_dim_key: spec.head_dim}, causal=causal,
                     window_left=left, sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype,
                     kv_data_type=spec.torch_dtype, **self.variant_kwargs(spec))

        def forward(q, k, v):
            return p.unflatten(wrapper.run(q, k, v))
        def pre(q, k, v):
            return tuple(p.flatten(t).contiguous() for t in (q, k, v))
        closure = autograd_closure(spec, inputs, forward, pre)
        info = self.base_info() | {"kernel": "flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run",
                                   "window_left": left, "flattened_dense": p.batch is not None,
                                   "template": self.backend}
        return Prepared(fn=closure, info=info)

    def _sinks(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool) -> Prepared:
        """The sink wrapper over pages of one token (the module docstring); only ``run`` is timed."""
        mod = importlib.import_module(self.package)
        p, device, dtype = packed(spec, inputs), inputs.q.device, spec.torch_dtype
        q, k, v = (p.flatten(t).contiguous() for t in (inputs.q, inputs.k, inputs.v))
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = mod.BatchAttentionWithAttentionSinkWrapper(
            workspace, "NHD", backend=self.backend, q_data_type=dtype, kv_data_type=dtype,
            head_dim_qk=spec.head_dim, head_dim_vo=spec.head_dim_v, window_left=left)
        sequences = len(p.seqlens_k)
        wrapper.plan(p.cu_seqlens_q, p.cu_seqlens_k, torch.arange(k.shape[0], dtype=torch.int32, device=device),
                     torch.ones(sequences, dtype=torch.int32, device=device), spec.heads_q, spec.heads_kv,
                     spec.head_dim, 1, causal=causal, window_left=left, sm_scale=spec.softmax_scale,
                     q_data_type=dtype, kv_data_type=dtype)
        cache, sinks = (k.unsqueeze(1), v.unsqueeze(1)), inputs.sinks.float().contiguous()

        def call() -> Outputs:
            with torch.no_grad():
                return Outputs(out=p.unflatten(wrapper.run(q, cache, sinks, spec.softmax_scale)))
        info = self.base_info() | {"kernel": "flashinfer.BatchAttentionWithAttentionSinkWrapper.run",
                                   "window_left": left, "cache": "pages of one token (the contiguous K/V)",
                                   "template": self.backend}
        return Prepared(fn=call, info=info)


class _FlashInferPaged(KernelBackend):
    """FlashInfer over a paged KV cache (``kvcache.build_cache``: pages handed out in a shuffled order), NHD
    layout, the page metadata FlashInfer takes: ``indptr`` (N+1) into ``indices`` (every request's pages in
    order) and ``last_page_len`` (tokens in each request's last page). ``plan`` runs in ``prepare``; only
    ``run(q, (k_cache, v_cache))`` is timed. FlashInfer's LSE is base 2 by default and is not returned, so
    the check judges the output alone."""

    package = "flashinfer"
    distribution = "flashinfer-python"
    default_sweep = False
    compiles_ahead = True
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128, 256), varlen=True,
                                backward=False, different_v_dim=False, min_compute_capability=(8, 0), softcap=True)
    wrapper = ""

    option_ranges = {"page_size": (1, MAX_PAGE_SIZE)}

    def __init__(self, page_size: int = 16):
        self.page_size = int(page_size)

    def wrapper_kwargs(self) -> dict:
        return {}

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if self.page_size < 1:
            return f"page size must be positive, got {self.page_size}"
        if any(sq > sk for sq, sk in zip(spec.seqlens_q, spec.seqlens_k)):
            return "more new queries than cached keys"
        return None

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and not hasattr(importlib.import_module(self.package), self.wrapper):
            return f"{self.package} has no {self.wrapper}"
        return reason

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        from attnbench.backends.kvcache import build_cache

        mod, p = importlib.import_module(self.package), packed(spec, inputs)
        cache = build_cache(p.flatten(inputs.k), p.flatten(inputs.v), p.seqlens_k, self.page_size, seed=inputs.seed)
        indptr, indices, last_page_len = page_metadata(cache.block_table, p.seqlens_k, self.page_size)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=inputs.q.device)
        wrapper = getattr(mod, self.wrapper)(workspace, "NHD", **self.wrapper_kwargs())
        self.plan(wrapper, spec, p, indptr, indices, last_page_len)
        q, kv = p.flatten(inputs.q).contiguous(), (cache.k_cache, cache.v_cache)

        def call() -> Outputs:
            with torch.no_grad():
                out = wrapper.run(q, kv)
            return Outputs(out=p.unflatten(out.reshape(-1, *out.shape[-2:])))
        info = self.base_info() | {"kernel": f"flashinfer.{self.wrapper}.run", "gqa": "native" if spec.gqa else "none",
                                   "cache": f"paged, {self.page_size} tokens a page"} | self.wrapper_kwargs()
        return first_call(Prepared(fn=call, info=info), inputs.q.device)


class FlashInferDecode(_FlashInferPaged):
    name = "flashinfer-decode"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper (one new query per request, paged KV cache)"
    function = "BatchDecodeWithPagedKVCacheWrapper"
    wrapper = "BatchDecodeWithPagedKVCacheWrapper"

    def __init__(self, page_size: int = 16, use_tensor_cores: bool = False):
        super().__init__(page_size)
        self.use_tensor_cores = bool(use_tensor_cores)

    def wrapper_kwargs(self) -> dict:
        # FlashInfer's default decode kernel runs on CUDA cores; its docs advise tensor cores for large GQA
        # groups (--backend-opt flashinfer-decode.use_tensor_cores=true)
        return {"use_tensor_cores": True} if self.use_tensor_cores else {}

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if set(spec.seqlens_q) != {1}:
            return "the decode wrapper takes one new query per request (use flashinfer-paged for more)"
        return super().extra_reason(spec, device)

    def plan(self, wrapper, spec: AttnSpec, p, indptr, indices, last_page_len) -> None:
        # one query that sees every cached key: causal or not is the same attention
        wrapper.plan(indptr, indices, last_page_len, spec.heads_q, spec.heads_kv, spec.head_dim, self.page_size,
                     sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype, kv_data_type=spec.torch_dtype,
                     logits_soft_cap=spec.softcap)


class FlashInferPaged(_FlashInferPaged):
    name = "flashinfer-paged"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper (new queries over a paged KV cache)"
    function = "BatchPrefillWithPagedKVCacheWrapper"
    wrapper = "BatchPrefillWithPagedKVCacheWrapper"

    def plan(self, wrapper, spec: AttnSpec, p, indptr, indices, last_page_len) -> None:
        wrapper.plan(p.cu_seqlens_q, indptr, indices, last_page_len, spec.heads_q, spec.heads_kv, spec.head_dim,
                     self.page_size, causal=spec.causal, sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype,
                     kv_data_type=spec.torch_dtype, logits_soft_cap=spec.softcap)


def page_metadata(block_table: torch.Tensor, seqlens_k, page_size: int):
    """FlashInfer's (indptr, indices, last_page_len), int32, from a block table (N, pages) and the cache lengths."""
    used = [-(-s // page_size) for s in seqlens_k]
    indices = torch.cat([block_table[i, :n] for i, n in enumerate(used)])
    indptr = torch.zeros(len(used) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(used), 0)
    last = torch.tensor([s - (n - 1) * page_size for s, n in zip(seqlens_k, used)], dtype=torch.int32)
    device = block_table.device
    return indptr.to(device), indices.to(torch.int32), last.to(device)

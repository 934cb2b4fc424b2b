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
  it, so they are not used for sinks. The wrapper is built with a JIT module named after its head sizes
  (``sink_wrapper``: FlashInfer's own name leaves them out, and one head size's build ran for the others).

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
from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Outputs, Prepared, autograd_closure, sync
from attnbench.backends.kernel import KernelBackend, effective_window, has_param, packed
from attnbench.features.alibi import alibi_label
from attnbench.inputs import AttnInputs, cu_seqlens
from attnbench.spec import MAX_PAGE_SIZE, AttnSpec

WORKSPACE_BYTES = 128 << 20


def first_call(prepared: Prepared, device: torch.device) -> Prepared:
    """Call the kernel once (building its JIT module if not cached) and record the seconds that took."""
    start = time.perf_counter()
    prepared.fn()
    sync(device)
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
        template = self.template_ran(spec, inputs.q.device)
        if spec.sinks:
            prepared = self._sinks(spec, inputs, left, right == 0, template)
        elif not inputs.varlen and spec.batch == 1:
            prepared = self._single(spec, inputs, left, right == 0)
        else:
            prepared = self._ragged(spec, inputs, left, right == 0)
        prepared.info["template_ran"] = template
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

    def _sinks(self, spec: AttnSpec, inputs: AttnInputs, left: int, causal: bool, template: str) -> Prepared:
        """The sink wrapper over pages of one token (the module docstring); only ``run`` is timed."""
        mod = importlib.import_module(self.package)
        p, device, dtype = packed(spec, inputs), inputs.q.device, spec.torch_dtype
        q, k, v = (p.flatten(t).contiguous() for t in (inputs.q, inputs.k, inputs.v))
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper, module = sink_wrapper(mod, workspace, spec, template, left)
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
                                   "template": self.backend, "jit_module": module}
        return Prepared(fn=call, info=info)


def sink_wrapper(mod, workspace: torch.Tensor, spec: AttnSpec, template: str, left: int):
    """FlashInfer's sink wrapper for the case and ``template`` (``FlashInfer.template_ran``), as ``(wrapper, JIT
    module name)``.

    ``BatchAttentionWithAttentionSinkWrapper`` (0.7.2) names its JIT module after the query dtype, the window
    flag and the template only, and the build is cached on disk under that name: the first head size built on a
    machine was then run for every other one (d64 after d128 on an H200: out rel-L2 1.8 against the exact
    result, while d128 passed). The same wrapper is built here through its parent's public ``jit_args`` with a
    name that also holds the head sizes and the key/value dtype; a FlashInfer without those pieces, or whose
    template is not known, gets its own wrapper (and its naming)."""
    dtype = spec.torch_dtype
    try:
        decl = importlib.import_module(f"{mod.__name__}.jit.attention.variants").attention_sink_decl[template]
    except (ImportError, AttributeError, KeyError):
        wrapper = mod.BatchAttentionWithAttentionSinkWrapper(
            workspace, "NHD", backend=template if template in ("fa2", "fa3") else "auto", q_data_type=dtype,
            kv_data_type=dtype, head_dim_qk=spec.head_dim, head_dim_vo=spec.head_dim_v, window_left=left)
        return wrapper, "flashinfer's own name (no head size in it)"
    name = str(dtype).removeprefix("torch.")
    module = (f"batch_prefill_attention_sink_{name}_{name}_qk{spec.head_dim}_vo{spec.head_dim_v}"
              f"_swa_{left >= 0}_{template}")
    jit_args = [module, dtype, dtype, dtype, torch.int32, spec.head_dim, spec.head_dim_v, ["sink"], ["float"],
                ["sm_scale"], ["double"], "AttentionSink", decl]
    jit_kwargs = {"use_sliding_window": left >= 0, "use_fp16_qk_reduction": False, "pos_encoding_mode": 0,
                  "paged_kv_stride_mode": "independent" if template == "fa2" else "runtime", "module_surface": "full"}
    wrapper = mod.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=template, jit_args=jit_args,
                                                      jit_kwargs=jit_kwargs)
    return wrapper, module


class _FlashInferPaged(KernelBackend):
    """FlashInfer over a paged KV cache (``kvcache.build_cache``: pages handed out in a shuffled order, a shared
    prefix's full pages shared by every request), NHD layout, the page metadata FlashInfer takes: ``indptr``
    (N+1) into ``indices`` (every request's pages in order) and ``last_page_len`` (tokens in each request's last
    page). ``plan`` runs in ``prepare`` and its milliseconds are recorded (``info["plan_ms"]``: a server pays
    them every step); only ``run`` is timed, into an output buffer allocated once (FlashInfer's own allocation
    zero-fills it at every call). An fp8 KV cache (one descale per tensor) takes bf16/fp16 queries: FlashInfer
    folds the key descale into the softmax scale and multiplies the output by the value descale. The record's
    ``info["template_ran"]`` is the template FlashInfer chose at ``plan`` (``fa2`` or ``fa3``; its ``auto``
    takes fa2 for fp8 caches under 16-bit queries and for custom masks)."""

    package = "flashinfer"
    distribution = "flashinfer-python"
    default_sweep = False
    compiles_ahead = True
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128, 256), varlen=True,
                                backward=False, different_v_dim=False, min_compute_capability=(8, 0), softcap=True,
                                paged=True, shared_prefix=True, kv_fp8=True)
    wrapper = ""

    option_ranges = {"page_size": (1, MAX_PAGE_SIZE)}

    def __init__(self, page_size: int = 16):
        self.page_size = int(page_size)

    def page(self, spec: AttnSpec) -> int:
        return spec.page_size or self.page_size

    def wrapper_kwargs(self) -> dict:
        return {}

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if self.page_size < 1:
            return f"page size must be positive, got {self.page_size}"
        if any(sq > sk for sq, sk in zip(spec.seqlens_q, spec.seqlens_k)):
            return "more new queries than cached keys"
        if spec.kv_dtype == "fp8-head":
            return "FlashInfer takes one descale per K and V tensor (fp8), not one per head"
        return None

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and not hasattr(importlib.import_module(self.package), self.wrapper):
            return f"{self.package} has no {self.wrapper}"
        return reason

    def scales(self, inputs: AttnInputs) -> dict:
        """``k_scale``/``v_scale`` of an fp8 cache, as the floats FlashInfer takes; {} otherwise."""
        if inputs.descale is None:
            return {}
        return {"k_scale": float(inputs.descale[1][0]), "v_scale": float(inputs.descale[2][0])}

    def paged_cache(self, spec: AttnSpec, inputs: AttnInputs):
        """(packed view, the paged cache, the write of the step's new tokens into it: ``kvcache.append_call``)."""
        from attnbench.backends.kvcache import append_call, build_cache
        p = packed(spec, inputs)
        prefix = None if inputs.prefix_k is None else (inputs.prefix_k, inputs.prefix_v)
        k, v = p.flatten(inputs.k), p.flatten(inputs.v)
        cache = build_cache(k, v, p.seqlens_k, self.page(spec), seed=inputs.seed, prefix=prefix)
        return p, cache, {"append": append_call(cache, p, k, v, inputs, self.page(spec))}

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod = importlib.import_module(self.package)
        p, cache, side = self.paged_cache(spec, inputs)
        page = self.page(spec)
        indptr, indices, last_page_len = page_metadata(cache.block_table, p.seqlens_k, page)
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=inputs.q.device)
        wrapper = getattr(mod, self.wrapper)(workspace, "NHD", **self.wrapper_kwargs())
        plan_ms = timed_plan(lambda: self.plan(wrapper, spec, p, indptr, indices, last_page_len), inputs.q.device)
        q, kv = p.flatten(inputs.q).contiguous(), (cache.k_cache, cache.v_cache)
        out = q.new_empty(*q.shape[:-1], spec.head_dim_v)
        scales = self.scales(inputs)

        def call() -> Outputs:
            with torch.no_grad():
                wrapper.run(q, kv, out=out, **scales)
            return Outputs(out=out)
        return self.prepared(spec, page, cache, plan_ms, call, lambda o: Outputs(out=p.unflatten(o.out.clone())),
                             side, template_ran=template_of(wrapper), **self.wrapper_kwargs())

    def prepared(self, spec: AttnSpec, page: int, cache, plan_ms: float, call, finish, side: dict,
                 **info) -> Prepared:
        """The case ready to time: what runs (the wrapper's ``run``, GQA, the cache, its shared pages, and
        ``info``), called once untimed (the JIT build, if any, happens at ``plan`` or at this first run), with
        the milliseconds of its ``plan``."""
        info = self.base_info() | {"kernel": f"flashinfer.{self.wrapper}.run", "gqa": "native" if spec.gqa else "none",
                                   "cache": f"paged, {page} tokens a page", "shared_pages": cache.shared_pages} | info
        prepared = first_call(Prepared(fn=call, info=info, finish=finish, side=side), cache.k_cache.device)
        prepared.info["plan_ms"] = round(plan_ms, 4)
        return prepared


def timed_plan(plan, device: torch.device) -> float:
    """Milliseconds of a wrapper's ``plan`` as a server pays it every step: called once first, untimed (a
    process's first ``plan`` of a module also loads the module), then timed."""
    plan()
    sync(device)
    start = time.perf_counter()
    plan()
    sync(device)
    return (time.perf_counter() - start) * 1e3


def template_of(wrapper) -> str:
    """The template a FlashInfer wrapper runs (its ``_backend`` after ``plan``; the CUDA-core decode kernel for a
    decode wrapper without tensor cores, whatever ``_backend`` says)."""
    if getattr(wrapper, "use_tensor_cores", True) is False:
        return "cuda-core decode"
    return str(getattr(wrapper, "_backend", "unknown"))


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
        wrapper.plan(indptr, indices, last_page_len, spec.heads_q, spec.heads_kv, spec.head_dim, self.page(spec),
                     sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype, kv_data_type=spec.kv_torch_dtype,
                     logits_soft_cap=spec.softcap)


class FlashInferPaged(_FlashInferPaged):
    name = "flashinfer-paged"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper (new queries over a paged KV cache, mixed batches)"
    function = "BatchPrefillWithPagedKVCacheWrapper"
    wrapper = "BatchPrefillWithPagedKVCacheWrapper"
    capabilities = replace(_FlashInferPaged.capabilities, tree=True)

    def __init__(self, page_size: int = 16, backend: str = "auto"):
        super().__init__(page_size)
        if backend not in FlashInfer.TEMPLATES:
            raise ValueError(f"backend must be one of {', '.join(FlashInfer.TEMPLATES)}, got {backend!r}")
        self.backend = backend
        """The prefill template (``--backend-opt flashinfer-paged.backend=fa2``): ``auto`` lets FlashInfer choose
        (fa3 on Hopper, fa2 for custom masks and fp8 caches under 16-bit queries)."""

    def wrapper_kwargs(self) -> dict:
        return {} if self.backend == "auto" else {"backend": self.backend}

    def plan(self, wrapper, spec: AttnSpec, p, indptr, indices, last_page_len) -> None:
        mask = {}
        if spec.tree is not None:  # every request's (new, keys) mask, flattened row-major, one after another
            from attnbench.masks import keep_mask
            device = indptr.device
            mask["custom_mask"] = torch.cat([keep_mask(sq, sk, True, device=device, tree=spec.tree).flatten()
                                             for sq, sk in zip(p.seqlens_q, p.seqlens_k, strict=True)])
        wrapper.plan(p.cu_seqlens_q, indptr, indices, last_page_len, spec.heads_q, spec.heads_kv, spec.head_dim,
                     self.page(spec), causal=spec.causal, sm_scale=spec.softmax_scale, q_data_type=spec.torch_dtype,
                     kv_data_type=spec.kv_torch_dtype, o_data_type=spec.torch_dtype, logits_soft_cap=spec.softcap,
                     **mask)


class FlashInferPOD(_FlashInferPaged):
    """The prefill requests (more than one new token) and the decode requests (one) of a mixed batch in one
    kernel launch: ``BatchPODWithPagedKVCacheWrapper``, its FA2-style POD kernel. Both parts read the same paged
    cache through their own page tables; the queries of each part are gathered in ``prepare`` and the outputs
    put back in request order untimed (``finish``)."""

    name = "flashinfer-pod"
    description = "FlashInfer BatchPODWithPagedKVCacheWrapper (a mixed batch's prefills and decodes in one launch)"
    function = "BatchPODWithPagedKVCacheWrapper"
    wrapper = "BatchPODWithPagedKVCacheWrapper"
    capabilities = replace(_FlashInferPaged.capabilities, softcap=False, kv_fp8=False)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if 1 not in spec.seqlens_q or set(spec.seqlens_q) == {1}:
            return "POD takes a mixed batch: requests with one new token and requests with more"
        if not spec.causal:
            return "POD's decode part has no mask: the batch must be causal"
        return super().extra_reason(spec, device)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod, device = importlib.import_module(self.package), inputs.q.device
        p, cache, side = self.paged_cache(spec, inputs)
        page = self.page(spec)
        parts = {"p": [i for i, sq in enumerate(p.seqlens_q) if sq > 1], "d": [i for i, sq in enumerate(p.seqlens_q) if sq == 1]}
        q_all, offsets = p.flatten(inputs.q), p.cu_seqlens_q.tolist()
        rows = {k: torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in idx]).to(device) for k, idx in parts.items()}
        q = {k: q_all[r].contiguous() for k, r in rows.items()}
        meta = {}
        for k, idx in parts.items():
            lens_q, lens_k = [p.seqlens_q[i] for i in idx], [p.seqlens_k[i] for i in idx]
            meta[k] = (cu_seqlens(lens_q, device), *page_metadata(cache.block_table[idx], lens_k, page))
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = mod.BatchPODWithPagedKVCacheWrapper(workspace, "NHD")
        plan_ms = timed_plan(lambda: wrapper.plan(*meta["p"], *meta["d"], spec.heads_q, spec.heads_kv, spec.head_dim,
                                                  page, q_data_type=spec.torch_dtype, kv_data_type=spec.torch_dtype,
                                                  sm_scale=spec.softmax_scale), device)
        kv = (cache.k_cache, cache.v_cache)

        def call() -> Outputs:
            with torch.no_grad():
                out_p, out_d = wrapper.run(q["p"], kv, q["d"], kv, causal_p=True)
            return Outputs(out=(out_p, out_d))

        def finish(o: Outputs) -> Outputs:
            out = q_all.new_empty(q_all.shape[0], spec.heads_q, spec.head_dim_v)
            out[rows["p"]], out[rows["d"]] = o.out
            return Outputs(out=p.unflatten(out))
        return self.prepared(spec, page, cache, plan_ms, call, finish, side, template_ran="fa2 (POD)",
                             prefill_requests=len(parts["p"]), decode_requests=len(parts["d"]))


class FlashInferPersistent(_FlashInferPaged):
    """FlashInfer's persistent ``BatchAttention``: one launch for any mix of prefill and decode requests, its
    own scheduler splitting the work into two tile sizes; ``plan`` takes each request's key count. It always
    returns its LSE (base 2), which is not checked (``finish``)."""

    name = "flashinfer-persistent"
    description = "FlashInfer BatchAttention (persistent kernel: any mix of prefill and decode in one launch)"
    function = "BatchAttention"
    wrapper = "BatchAttention"

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod, device = importlib.import_module(self.package), inputs.q.device
        p, cache, side = self.paged_cache(spec, inputs)
        page = self.page(spec)
        indptr, indices, _ = page_metadata(cache.block_table, p.seqlens_k, page)
        wrapper = mod.BatchAttention("NHD", device=str(device))
        kv_lens = torch.tensor(p.seqlens_k, dtype=torch.int32, device=device)
        plan_ms = timed_plan(lambda: wrapper.plan(
            p.cu_seqlens_q, indptr, indices, kv_lens, spec.heads_q, spec.heads_kv, spec.head_dim, spec.head_dim_v,
            page, causal=spec.causal, sm_scale=spec.softmax_scale, logits_soft_cap=spec.softcap,
            q_data_type=spec.torch_dtype, kv_data_type=spec.kv_torch_dtype), device)
        q, kv = p.flatten(inputs.q).contiguous(), (cache.k_cache, cache.v_cache)
        out = q.new_empty(*q.shape[:-1], spec.head_dim_v)
        lse = torch.empty(q.shape[0], spec.heads_q, dtype=torch.float32, device=device)
        scales = self.scales(inputs)
        cap = {"logits_soft_cap": spec.softcap} if spec.softcap is not None else {}

        def call() -> Outputs:
            with torch.no_grad():
                wrapper.run(q, kv, out=out, lse=lse, **scales, **cap)
            return Outputs(out=out, lse=lse)

        def finish(o: Outputs) -> Outputs:
            # Its LSE (base 2, always returned) is not handed to the check: on an H100 it was up to 3e-4 off the
            # exact one (natural log), six times the float32 floor the check holds an LSE to, with the output exact.
            return Outputs(out=p.unflatten(o.out.clone()))
        return self.prepared(spec, page, cache, plan_ms, call, finish, side, template_ran="persistent (fa2-style)",
                             indices_kept=indices.shape[0])


class FlashInferCascade(_FlashInferPaged):
    """A shared prefix read once for the whole batch: ``MultiLevelCascadeAttentionWrapper`` with two levels, the
    prefix's shared pages attended by every query at once (level 0), each request's own pages (level 1, causal),
    the two merged by their LSEs inside ``run``. Needs a shared prefix of at least one full page."""

    name = "flashinfer-cascade"
    description = "FlashInfer MultiLevelCascadeAttentionWrapper (a shared prefix read once, merged by LSE)"
    function = "MultiLevelCascadeAttentionWrapper"
    wrapper = "MultiLevelCascadeAttentionWrapper"
    capabilities = replace(_FlashInferPaged.capabilities, kv_fp8=False)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.shared_prefix < self.page(spec):
            return f"cascade needs a shared prefix of at least one page ({self.page(spec)} tokens)"
        return super().extra_reason(spec, device)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod, device = importlib.import_module(self.package), inputs.q.device
        p, cache, side = self.paged_cache(spec, inputs)
        page, shared = self.page(spec), cache.shared_pages
        table = cache.block_table
        own = [sk - shared * page for sk in p.seqlens_k]
        indptr_own, indices_own, last_own = page_metadata(table[:, shared:], own, page)
        total_q = sum(p.seqlens_q)
        levels = ([torch.tensor([0, total_q], dtype=torch.int32, device=device), p.cu_seqlens_q],
                  [torch.tensor([0, shared], dtype=torch.int32, device=device), indptr_own],
                  [table[0, :shared].contiguous(), indices_own],
                  [torch.tensor([page], dtype=torch.int32, device=device), last_own])
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = mod.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
        plan_ms = timed_plan(lambda: wrapper.plan(*levels, spec.heads_q, spec.heads_kv, spec.head_dim, page,
                                                  causal=spec.causal, sm_scale=spec.softmax_scale,
                                                  logits_soft_cap=spec.softcap, q_data_type=spec.torch_dtype,
                                                  kv_data_type=spec.torch_dtype), device)
        q, kv = p.flatten(inputs.q).contiguous(), (cache.k_cache, cache.v_cache)

        def call() -> Outputs:
            with torch.no_grad():
                return Outputs(out=wrapper.run(q, kv))
        template = (template_of(wrapper._batch_prefill_wrappers[0]) if hasattr(wrapper, "_batch_prefill_wrappers")
                    else "unknown")
        return self.prepared(spec, page, cache, plan_ms, call, lambda o: Outputs(out=p.unflatten(o.out)), side,
                             template_ran=template)


def page_metadata(block_table: torch.Tensor, seqlens_k, page_size: int):
    """FlashInfer's (indptr, indices, last_page_len), int32, from a block table (N, pages) and the cache lengths."""
    used = [-(-s // page_size) for s in seqlens_k]
    indices = torch.cat([block_table[i, :n] for i, n in enumerate(used)])
    indptr = torch.zeros(len(used) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(used), 0)
    last = torch.tensor([s - (n - 1) * page_size for s, n in zip(seqlens_k, used)], dtype=torch.int32)
    device = block_table.device
    return indptr.to(device), indices.to(torch.int32), last.to(device)

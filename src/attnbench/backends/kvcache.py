"""Attention over a KV cache (decode, and prefill with a prefix cache): flash-attn's ``flash_attn_with_kvcache``.

- ``fa2-kvcache``  flash_attn.flash_attn_with_kvcache on a contiguous cache
- ``fa2-paged``    the same on a paged cache: pages of 256 tokens (flash-attn 2 takes page sizes divisible
                   by 256) and a block table
- ``fa3-kvcache``  flash_attn_interface.flash_attn_with_kvcache (FlashAttention-3) on a contiguous cache
- ``fa3-paged``    the same on pages of ``page_size`` tokens (default 16; ``--backend-opt fa3-paged.page_size=64``),
                   for FA3 builds with paged KV

A case is N requests (the sequences of a grouped case, or the batch of a dense one), each with the same
number of new queries (1-16 for decode) and its own cache length (its key length): ``--seq-lens 1,1,1
--kv-seq-lens 1024,8192,32768`` is one decode step of three requests. ``prepare`` builds the cache from the
case's keys and values: contiguous, (N, longest cache, Hkv, D) with each request's keys first and
``cache_seqlens`` giving the lengths; paged, a pool of pages handed to the requests in a shuffled order (an
allocator gives no request adjacent pages) and a block table (N, pages of the longest cache), int32. The
cache is not updated in the timed call (no new k, v): it times the attention of the decode step. Causal
is the kernel's own lower-right alignment (the new queries are the last positions of their cache).
Forward only; the LSE comes back through ``return_softmax_lse``. FA3 also takes fp8 caches (``--dtype
fp8`` / ``fp8-head``, with the descales of ``fa3.descale_kwargs``, one row per request).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, replace

import torch

from attnbench.backends.base import Capabilities, Outputs, Prepared, SideCall
from attnbench.backends.fa3 import Fa3Build, build_flags, descale_kwargs
from attnbench.backends.kernel import KernelBackend, packed
from attnbench.inputs import AttnInputs, to_e4m3
from attnbench.spec import FP8_DTYPES, MAX_PAGE_SIZE, AttnSpec

_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, varlen=True, backward=False,
                     different_v_dim=False, min_compute_capability=(8, 0), shared_prefix=True)


@dataclass(frozen=True, kw_only=True)
class KVCache:
    """A cache built from a case's keys and values."""

    k_cache: torch.Tensor
    """(N, Smax, Hkv, D) contiguous, or (pages, page_size, Hkv, D) paged."""
    v_cache: torch.Tensor | None
    """Same shape as ``k_cache`` (None for a cache of keys only, ``build_cache(v_thd=None)``)."""
    cache_seqlens: torch.Tensor
    """int32 (N,): tokens of each request's cache."""
    block_table: torch.Tensor | None = None
    """int32 (N, pages per request) page indices; None for a contiguous cache."""
    shared_pages: int = 0
    """The first ``shared_pages`` pages of every request's table are the same pages (a shared prefix)."""


def build_cache(k_thd: torch.Tensor, v_thd: torch.Tensor | None, seqlens_k: tuple[int, ...], page_size: int | None,
                seed: int = 0, prefix: tuple[torch.Tensor, torch.Tensor] | None = None) -> KVCache:
    """The cache of requests whose keys/values are packed in ``k_thd``/``v_thd`` (T, Hkv, D), one after
    another with the lengths ``seqlens_k``; ``page_size`` None = contiguous. With ``prefix`` (its keys and
    values, (P, Hkv, D)), the packed tensors hold each request's own keys (after the prefix) and
    ``seqlens_k`` counts the prefix too: a paged cache stores the prefix's full pages once and every request's
    table points at them (as a server shares a prompt's pages); the prefix's last, partial page is each
    request's own, like its own tokens. A contiguous cache writes the prefix into every row."""
    if v_thd is None:  # keys only (MLA's latent cache, whose values are part of each key row)
        c = build_cache(k_thd, k_thd[..., :1], seqlens_k, page_size, seed,  # a one-wide stand-in, dropped
                        None if prefix is None else (prefix[0], prefix[0][..., :1]))
        return replace(c, v_cache=None)
    if k_thd.dtype == torch.float8_e4m3fn:  # index_put is not on every torch for fp8: move the bytes
        as_bytes = None if prefix is None else tuple(t.view(torch.uint8) for t in prefix)
        c = build_cache(k_thd.view(torch.uint8), v_thd.view(torch.uint8), seqlens_k, page_size, seed, as_bytes)
        return replace(c, k_cache=c.k_cache.view(k_thd.dtype), v_cache=c.v_cache.view(v_thd.dtype))
    n, longest, device = len(seqlens_k), max(seqlens_k), k_thd.device
    plen = 0 if prefix is None else prefix[0].shape[0]
    lengths = torch.tensor(seqlens_k, dtype=torch.int32, device=device)
    starts = [0]
    for s in seqlens_k[:-1]:
        starts.append(starts[-1] + s - plen)
    shared = 0 if page_size is None else plen // page_size  # pages every request shares
    copied = plen - shared * (page_size or 0)  # prefix tokens each request holds itself

    def request_tokens(src_pair, i):  # (k, v) of request i beyond the shared pages
        own = [t[starts[i]:starts[i] + seqlens_k[i] - plen] for t in src_pair]
        if copied:
            return [torch.cat([pre[plen - copied:], t]) for pre, t in zip(prefix, own)]
        return own
    if page_size is None:
        k_cache = k_thd.new_zeros(n, longest, *k_thd.shape[1:])
        v_cache = v_thd.new_zeros(n, longest, *v_thd.shape[1:])
        for i, s in enumerate(seqlens_k):
            k_cache[i, :s], v_cache[i, :s] = request_tokens((k_thd, v_thd), i)
        return KVCache(k_cache=k_cache, v_cache=v_cache, cache_seqlens=lengths)
    per_request = -(-longest // page_size)
    used = [-(-s // page_size) - shared for s in seqlens_k]  # each request's own pages
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(shared + sum(used), generator=generator).tolist()
    k_cache = k_thd.new_zeros(shared + sum(used), page_size, *k_thd.shape[1:])
    v_cache = v_thd.new_zeros(shared + sum(used), page_size, *v_thd.shape[1:])
    table = torch.zeros(n, per_request, dtype=torch.int32)
    shared_pages, taken = order[:shared], shared
    if shared:
        for cache, src in zip((k_cache, v_cache), prefix):
            cache.view(-1, *src.shape[1:])[_token_slots(shared_pages, page_size, device)] = src[:shared * page_size]
    for i in range(n):
        pages = order[taken:taken + used[i]]
        taken += used[i]
        table[i, :shared + used[i]] = torch.tensor(shared_pages + pages, dtype=torch.int32)
        for cache, src in zip((k_cache, v_cache), request_tokens((k_thd, v_thd), i)):  # page by page, at once
            cache.view(-1, *src.shape[1:])[_token_slots(pages, page_size, device)[:src.shape[0]]] = src
    return KVCache(k_cache=k_cache, v_cache=v_cache, cache_seqlens=lengths, block_table=table.to(device),
                   shared_pages=shared)


def append_call(cache: KVCache, p, k_thd: torch.Tensor, v_thd: torch.Tensor | None, inputs: AttnInputs,
                page_size: int | None) -> SideCall:
    """The write a server makes every step before the attention: each request's new tokens (its last
    ``seqlens_q[i]`` keys and values) into their slots of the cache, through the page table, quantized first
    when the cache is fp8 (from the bf16 values, with the cache's descales: the very bits the cache holds). It
    writes what is already there, so the attention reads the same cache after it. ``k_thd``/``v_thd`` are
    what the cache was built from (``build_cache``: each request's own keys, after a shared prefix; a request's
    new tokens are never in the prefix, ``AttnSpec`` refuses that).

    Plain PyTorch (one ``index_copy_`` per tensor, and the quantization's own kernels): what a server without a
    fused write pays; vLLM's ``reshape_and_cache_flash`` and FlashInfer's ``append_paged_kv_cache`` do it in
    one launch."""
    plen = 0 if inputs.prefix_k is None else inputs.prefix_k.shape[0]
    device, rows, slots, start = k_thd.device, [], [], 0
    table = None if cache.block_table is None else cache.block_table.cpu()
    for i, (sq, sk) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        own = sk - plen
        rows.append(torch.arange(start + own - sq, start + own))
        start += own
        pos = torch.arange(sk - sq, sk)
        slots.append(i * cache.k_cache.shape[1] + pos if table is None
                     else table[i, pos // page_size].long() * page_size + pos % page_size)
    rows, slots = torch.cat(rows).to(device), torch.cat(slots).to(device)
    fp8 = k_thd.dtype == torch.float8_e4m3fn
    if fp8:  # the step's tokens arrive as bf16 values, quantized on the way in
        k_thd, v_thd = p.flatten(inputs.unquantized.k), p.flatten(inputs.unquantized.v)
    writes = [(cache.k_cache, k_thd[rows].contiguous(), inputs.descale[1] if fp8 else None)]
    if cache.v_cache is not None:
        writes.append((cache.v_cache, v_thd[rows].contiguous(), inputs.descale[2] if fp8 else None))

    def append() -> None:
        for pool, new, descale in writes:
            src = new if descale is None else to_e4m3(new, descale)
            if pool.dtype == torch.float8_e4m3fn:  # index_copy_ is not on every torch for fp8: move the bytes
                pool, src = pool.view(torch.uint8), src.view(torch.uint8)
            pool.view(-1, *pool.shape[-2:]).index_copy_(0, slots, src)
    written = sum(t.numel() * pool.element_size() for pool, t, _ in writes)
    how = "torch index_copy_" + (" after quantizing to e4m3 with the cache's descales" if fp8 else "")
    return SideCall(fn=append, info={"how": how, "tokens": int(rows.numel()), "bytes_written": written})


def request_outputs(p, out: torch.Tensor, lse: torch.Tensor | None) -> Outputs:
    """A cache kernel's (N, Sq, H, Dv) output and (N, H, Sq) LSE as the case's packed layout (the LSE as a varlen
    kernel gives it, (H, N·Sq))."""
    lse_ht = None if lse is None else lse.transpose(0, 1).reshape(lse.shape[1], -1)
    return Outputs(out=p.unflatten(out.reshape(-1, *out.shape[2:])), lse=p.unflatten_lse(lse_ht))


def _token_slots(pages: list[int], page_size: int, device) -> torch.Tensor:
    """Rows of the flattened (pages * page_size) pool that hold a request's tokens, in order."""
    return (torch.tensor(pages, device=device)[:, None] * page_size + torch.arange(page_size, device=device)).flatten()


class _KVCacheBackend(KernelBackend):
    function = "flash_attn_with_kvcache"
    page_size: int | None = None
    """Tokens per page when the case names none; None = a contiguous cache."""
    table_arg = "block_table"
    """Keyword of the block table in the kernel's signature."""
    lengths_arg = "cache_seqlens"
    """Keyword of the requests' cache lengths in the kernel's signature."""
    min_page_multiple = 1
    mixed_queries = False
    """Takes requests with different numbers of new queries in one call (``cu_seqlens_q``)."""

    def page(self, spec: AttnSpec) -> int | None:
        """Tokens a page holds for this case: the case's page size, else the backend's own (None: contiguous)."""
        return None if self.page_size is None else (spec.page_size or self.page_size)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if len(set(spec.seqlens_q)) != 1 and not self.mixed_queries:
            return "every request needs the same number of new queries (the kernel takes q as (N, Sq, H, D))"
        if any(sq > sk for sq, sk in zip(spec.seqlens_q, spec.seqlens_k)):
            return "more new queries than cached keys"
        page = self.page(spec)
        if page is not None and page % self.min_page_multiple:
            return f"page size {page} is not a multiple of {self.min_page_multiple}"
        return None

    def kwargs(self, spec: AttnSpec, inputs: AttnInputs) -> dict:
        return {"softmax_scale": spec.softmax_scale, "causal": spec.causal, "return_softmax_lse": True}

    def plan(self, spec: AttnSpec, kwargs: dict, q: torch.Tensor, cache: KVCache, page: int | None) -> dict:
        """Metadata a server computes once per step before the attention call, as keyword arguments (none here)."""
        return {}

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, p, page = self.kernel(), packed(spec, inputs), self.page(spec)
        n, sq = len(p.seqlens_q), p.seqlens_q[0]
        k, v = p.flatten(inputs.k), p.flatten(inputs.v)
        prefix = None if inputs.prefix_k is None else (inputs.prefix_k, inputs.prefix_v)
        cache = build_cache(k, v, p.seqlens_k, page, seed=inputs.seed, prefix=prefix)
        kwargs = self.kwargs(spec, inputs) | {self.lengths_arg: cache.cache_seqlens}
        if cache.block_table is not None:
            kwargs[self.table_arg] = cache.block_table
        uniform = len(set(p.seqlens_q)) == 1
        if uniform:
            q = p.flatten(inputs.q).reshape(n, sq, *inputs.q.shape[-2:])
        else:  # one packed tensor of every request's new queries (a mixed prefill/decode step)
            q = p.flatten(inputs.q)
            kwargs |= {"cu_seqlens_q": p.cu_seqlens_q, "max_seqlen_q": p.max_seqlen_q}
        start = time.perf_counter()
        kwargs |= self.plan(spec, kwargs, q, cache, page)
        plan_ms = (time.perf_counter() - start) * 1e3

        def call() -> Outputs:
            with torch.no_grad():
                out, lse = fn(q, cache.k_cache, cache.v_cache, **kwargs)[:2]
            if uniform:  # (N, Sq, H, D)
                return request_outputs(p, out, lse)
            return Outputs(out=p.unflatten(out), lse=p.unflatten_lse(lse))
        cache_bytes = 2 * cache.k_cache.numel() * cache.k_cache.element_size()
        info = self.base_info() | {"gqa": "native" if spec.gqa else "none", "cache_mib": round(cache_bytes / 2**20, 3),
                                   "cache": f"paged, {page} tokens a page" if page else "contiguous"}
        if cache.shared_pages:
            info["shared_pages"] = cache.shared_pages
        if not uniform:
            info["queries"] = "packed (cu_seqlens_q)"
        if "scheduler_metadata" in kwargs:
            info["plan_ms"] = round(plan_ms, 4)
        return Prepared(fn=call, info=info, side={"append": append_call(cache, p, k, v, inputs, page)})


class Fa2KVCache(_KVCacheBackend):
    name = "fa2-kvcache"
    description = "flash-attn 2 flash_attn_with_kvcache, contiguous KV cache + cache_seqlens (decode)"
    package = "flash_attn"
    distribution = "flash-attn"
    install = "pip install flash-attn --no-build-isolation"
    capabilities = _CAPS
    default_sweep = False


class Fa2Paged(Fa2KVCache):
    name = "fa2-paged"
    description = "flash-attn 2 flash_attn_with_kvcache, paged KV cache (256-token pages) + block table"
    capabilities = replace(_CAPS, paged=True)
    min_page_multiple = 256
    option_ranges = {"page_size": (256, MAX_PAGE_SIZE)}

    def __init__(self, page_size: int = 256):
        self.page_size = int(page_size)
        if self.page_size % self.min_page_multiple:
            raise ValueError(f"page_size must be a multiple of {self.min_page_multiple} (flash-attn 2's paged "
                             f"kernel), got {self.page_size}")


class Fa3KVCache(Fa3Build, _KVCacheBackend):
    name = "fa3-kvcache"
    description = "FlashAttention-3 flash_attn_with_kvcache, contiguous KV cache + cache_seqlens (decode)"
    package = "flash_attn_interface"
    distribution = "flash_attn_3"
    install = "build it from flash-attention's hopper/ folder (cd hopper && pip install . --no-build-isolation)"
    declared = replace(_CAPS, dtypes=(*_CAPS.dtypes, *FP8_DTYPES), head_dim_multiple=8, min_compute_capability=(9, 0))
    default_sweep = False
    mixed_queries = True

    def plan(self, spec: AttnSpec, kwargs: dict, q: torch.Tensor, cache: KVCache, page: int | None) -> dict:
        """FA3's scheduler metadata (``get_scheduler_metadata``: the split of the work over the SMs), which vLLM
        computes once per step and hands to every layer's call; builds without it plan inside the call."""
        module = importlib.import_module(self.package) if q.device.type == "cuda" else None
        if not hasattr(module, "get_scheduler_metadata"):
            return {}
        n = cache.cache_seqlens.shape[0]
        extra = {k: kwargs[k] for k in ("num_splits", "pack_gqa") if k in kwargs}
        metadata = module.get_scheduler_metadata(
            n, kwargs.get("max_seqlen_q", q.shape[1] if q.dim() == 4 else 1), max(spec.seqlens_k), spec.heads_q,
            spec.heads_kv, spec.head_dim, cache.cache_seqlens, qkv_dtype=q.dtype, headdim_v=spec.head_dim_v,
            cu_seqlens_q=kwargs.get("cu_seqlens_q"), page_size=page, causal=spec.causal, **extra)
        torch.cuda.synchronize(q.device)
        return {"scheduler_metadata": metadata}

    def kwargs(self, spec: AttnSpec, inputs: AttnInputs) -> dict:
        kw = super().kwargs(spec, inputs) | descale_kwargs(inputs, len(spec.sequences))
        flags = build_flags()
        if flags.get("FLASHATTENTION_DISABLE_SPLIT"):
            kw["num_splits"] = 1  # a build without split kernels crashes if the heuristic picks a split
        if flags.get("FLASHATTENTION_DISABLE_PACKGQA"):
            kw["pack_gqa"] = False
        return kw

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if build_flags().get("FLASHATTENTION_DISABLE_VARLEN"):
            return "this FlashAttention-3 build has no varlen kernels (cache_seqlens needs them)"
        if self.page(spec) is not None and build_flags().get("FLASHATTENTION_DISABLE_PAGEDKV"):
            return "this FlashAttention-3 build has no paged KV (built with FLASHATTENTION_DISABLE_PAGEDKV)"
        return super().extra_reason(spec, device)


class Fa3Paged(Fa3KVCache):
    name = "fa3-paged"
    description = "FlashAttention-3 flash_attn_with_kvcache, paged KV cache (page_size tokens a page) + page table"
    declared = replace(Fa3KVCache.declared, paged=True)
    table_arg = "page_table"
    option_ranges = {"page_size": (1, MAX_PAGE_SIZE)}

    def __init__(self, page_size: int = 16):
        self.page_size = int(page_size)

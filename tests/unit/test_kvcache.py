"""KV-cache backends (fa2/fa3 flash_attn_with_kvcache): the cache they build and the call they make,
checked on CPU against naive attention with a stand-in that reads the cache the documented way."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import fake_kernels as fk
import pytest
import torch

from attnbench.accuracy.reference import reference_attention
from attnbench.backends.kvcache import Fa2KVCache, Fa2Paged, Fa3KVCache, Fa3Paged, append_call, build_cache
from attnbench.backends.naive import NaiveBackend
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

CALLS: list[dict] = []


def with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, page_table=None, softmax_scale=None,
                 causal=False, return_softmax_lse=False, num_splits=0, pack_gqa=None, q_descale=None, k_descale=None,
                 v_descale=None):
    """flash_attn_with_kvcache's documented result: q (N, Sq, H, D) over each request's first
    cache_seqlens[i] cached keys (through the block table when given), causal aligned lower right;
    fp8 inputs stand for stored x descale[request, kv head] (FA3) and give a bf16 output."""
    CALLS.append({"block_table": block_table, "page_table": page_table, "num_splits": num_splits,
                  "descales": [d if d is None else tuple(d.shape) for d in (q_descale, k_descale, v_descale)],
                  "cache_dtype": k_cache.dtype})
    table = block_table if block_table is not None else page_table
    hk = k_cache.shape[-2]
    outs, lses = [], []
    for i in range(q.shape[0]):
        s = int(cache_seqlens[i])
        k = (k_cache[i] if table is None else torch.cat([k_cache[p] for p in table[i].tolist()]))[:s]
        v = (v_cache[i] if table is None else torch.cat([v_cache[p] for p in table[i].tolist()]))[:s]
        qi, k, v = (fk.fa3_values(t[None], None if d is None else d[i:i + 1], hk)[0]
                    for t, d in ((q[i], q_descale), (k, k_descale), (v, v_descale)))
        groups = q.shape[2] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = torch.einsum("qhd,khd->hqk", qi.double(), k.double()) * softmax_scale
        if causal:
            sq = q.shape[1]
            keep = torch.arange(s)[None, :] <= torch.arange(sq)[:, None] + (s - sq)
            scores = scores.masked_fill(~keep, -math.inf)
        lse = torch.logsumexp(scores, -1)
        out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.double()).to(out_dtype))
        lses.append(lse.float())
    return torch.stack(outs), torch.stack(lses)


@pytest.fixture(autouse=True)
def fake_kernel(monkeypatch):
    CALLS.clear()
    for cls in (Fa2KVCache, Fa3KVCache):
        monkeypatch.setattr(cls, "kernel", lambda self: with_kvcache)


DECODE = [
    AttnSpec(batch=1, seqlens_q=(1, 1, 1), seqlens_k=(17, 300, 77), heads_q=8, heads_kv=2, head_dim=16, dtype="fp32"),
    AttnSpec(batch=2, seqlens_q=(4, 4), seqlens_k=(257, 33), heads_q=4, heads_kv=4, head_dim=16, dtype="fp32",
             causal=True),
    AttnSpec(batch=3, seqlens_q=(5,), seqlens_k=(77,), heads_q=6, heads_kv=3, head_dim=16, dtype="fp32", causal=True),
]


@pytest.mark.parametrize("spec", DECODE, ids=lambda s: s.label())
@pytest.mark.parametrize("backend", [Fa2KVCache(), Fa2Paged(page_size=256), Fa3KVCache(), Fa3Paged(page_size=16)],
                         ids=lambda b: b.name)
def test_the_cached_call_gives_naive_attention(spec, backend):
    inputs = make_inputs(spec, torch.device("cpu"), seed=3)
    got = backend.prepare(spec, inputs).fn()
    want = NaiveBackend().prepare(spec, inputs).fn()
    assert got.out.shape == want.out.shape
    torch.testing.assert_close(got.out, want.out, rtol=1e-5, atol=1e-5)
    exact = reference_attention(spec, inputs, grads=False)   # lse (B, H, Sq) dense, (H, Tq) varlen
    torch.testing.assert_close(got.lse, exact.lse.to(got.lse.dtype), rtol=1e-5, atol=1e-5)
    paged = backend.page_size is not None
    table = CALLS[-1]["block_table" if backend.table_arg == "block_table" else "page_table"]
    assert (table is not None) == paged


def test_pages_are_scattered_and_each_request_reads_its_own_tokens():
    k = torch.arange(40, dtype=torch.float32).view(40, 1, 1)
    cache = build_cache(k, k.clone(), (7, 33), page_size=4, seed=1)
    assert cache.k_cache.shape == (2 + 9, 4, 1, 1) and cache.block_table.shape == (2, 9)
    used = cache.block_table[1].tolist()
    assert used != sorted(used)  # not handed out in order
    tokens = torch.cat([cache.k_cache[p] for p in used]).flatten()[:33]
    assert tokens.tolist() == list(range(7, 40))
    contiguous = build_cache(k, k.clone(), (7, 33), page_size=None)
    assert contiguous.k_cache.shape == (2, 33, 1, 1) and contiguous.cache_seqlens.tolist() == [7, 33]


def test_cases_a_cache_kernel_cannot_take_are_refused_with_the_reason():
    mixed = AttnSpec(batch=1, seqlens_q=(1, 2), seqlens_k=(64, 64), heads_q=4, head_dim=64, dtype="bf16")
    assert "same number of new queries" in Fa2KVCache().extra_reason(mixed, "cuda")
    more = AttnSpec(batch=1, seqlens_q=(64,), seqlens_k=(16,), heads_q=4, head_dim=64, dtype="bf16")
    assert "more new queries than cached keys" in Fa2KVCache().extra_reason(more, "cuda")
    ok = AttnSpec(batch=4, seqlens_q=(1,), seqlens_k=(4096,), heads_q=4, head_dim=64, dtype="bf16")
    small = Fa2Paged()
    small.page_size = 16  # the constructor refuses it (--backend-opt fa2-paged.page_size=16); a case still says why
    assert "multiple of 256" in small.extra_reason(ok, "cuda")
    assert Fa2Paged().extra_reason(ok, "cuda") is None
    with pytest.raises(ValueError, match="multiple of 256"):
        Fa2Paged(page_size=300)


def test_fa3_cache_backends_are_narrowed_to_the_installed_build(fake, monkeypatch):
    fake("fa3-trimmed")   # head sizes 64/128 only, no paged KV
    monkeypatch.setattr(sys.modules["flash_attn_interface"], "flash_attn_with_kvcache", with_kvcache, raising=False)
    d256 = AttnSpec(batch=4, seqlens_q=(1,), seqlens_k=(4096,), heads_q=8, heads_kv=2, head_dim=256, dtype="bf16")
    d128 = replace(d256, head_dim=128, head_dim_v=128)
    reason = Fa3KVCache().supports(d256, "cuda")
    assert "head size > 128 in this FlashAttention-3 build" in reason and "HDIM256" in reason
    assert Fa3KVCache().supports(d128, "cuda") is None
    assert "no paged KV" in Fa3Paged().supports(d128, "cuda")


# ---- FlashAttention-4 over a paged cache (fa4-paged) ------------------------------------------------------

def fa4_paged_varlen(q, k, v, cu_seqlens_q=None, max_seqlen_q=None, seqused_k=None, page_table=None,
                     softmax_scale=None, causal=False, return_lse=False, num_splits=1):
    """flash_attn.cute.flash_attn_varlen_func's documented result over a paged cache: q (N, Sq, H, D), or packed
    (total, H, D) with cu_seqlens_q; request i reads the first seqused_k[i] tokens of its pages, in page_table
    order; causal aligned lower right. Out in q's layout, LSE (N, H, Sq) or (H, total). Rows past seqused_k in a
    request's last page are loaded by the kernel (masked): they must be finite."""
    CALLS.append({"page_table": page_table, "num_splits": num_splits, "packed": cu_seqlens_q is not None})
    assert page_table.dtype == torch.int32 and seqused_k.dtype == torch.int32 and num_splits == 1
    page = k.shape[1]
    starts = cu_seqlens_q.tolist() if cu_seqlens_q is not None else [i * q.shape[1] for i in range(q.shape[0] + 1)]
    rows = q if cu_seqlens_q is not None else q.reshape(-1, *q.shape[2:])
    outs, lses = [], []
    for i in range(len(starts) - 1):
        s = int(seqused_k[i])
        pages = page_table[i, :-(-s // page)].tolist()
        assert torch.isfinite(k[pages]).all() and torch.isfinite(v[pages]).all()
        ki, vi = (torch.cat(list(t[pages]))[:s] for t in (k, v))
        qi = rows[starts[i]:starts[i + 1]]
        groups = q.shape[-2] // k.shape[2]
        ki, vi = ki.repeat_interleave(groups, 1), vi.repeat_interleave(groups, 1)
        scores = torch.einsum("qhd,khd->hqk", qi.double(), ki.double()) * softmax_scale
        if causal:
            sq = qi.shape[0]
            scores = scores.masked_fill(torch.arange(s)[None, :] > torch.arange(sq)[:, None] + (s - sq), -math.inf)
        lses.append(torch.logsumexp(scores, -1).float())
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vi.double()).to(q.dtype))
    if cu_seqlens_q is not None:
        return torch.cat(outs), torch.cat(lses, dim=1)
    return torch.stack(outs), torch.stack(lses)


FA4_CASES = [
    *DECODE,
    AttnSpec(batch=1, seqlens_q=(37, 1, 1, 5), seqlens_k=(300, 129, 7, 64), heads_q=8, heads_kv=2, head_dim=16,
             dtype="fp32", causal=True),  # a prefill chunk beside decodes and a speculative step
]


@pytest.mark.parametrize("spec", FA4_CASES, ids=lambda s: s.label())
@pytest.mark.parametrize("page_size", [128, 16, 7])
def test_fa4_paged_gives_the_exact_attention_of_each_request(spec, page_size, monkeypatch):
    from attnbench.backends.fa4 import Fa4Paged

    monkeypatch.setattr(Fa4Paged, "kernel", lambda self: fa4_paged_varlen)
    backend = Fa4Paged(page_size=page_size)
    assert backend.extra_reason(spec, "cuda") is None
    inputs = make_inputs(spec, torch.device("cpu"), seed=5)
    got = backend.prepare(spec, inputs).fn()
    exact = reference_attention(spec, inputs, grads=False)
    torch.testing.assert_close(got.out, exact.out.to(got.out.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.lse, exact.lse.to(got.lse.dtype), rtol=1e-5, atol=1e-5)
    assert CALLS[-1]["packed"] == (len(set(spec.seqlens_q)) > 1)


def test_fa4_paged_reads_a_shared_prefix_from_shared_pages(monkeypatch):
    from attnbench.backends.fa4 import Fa4Paged

    monkeypatch.setattr(Fa4Paged, "kernel", lambda self: fa4_paged_varlen)
    spec = AttnSpec(batch=1, seqlens_q=(3, 1, 1), seqlens_k=(300, 290, 280), heads_q=4, heads_kv=4, head_dim=16,
                    dtype="fp32", causal=True, shared_prefix=256, page_size=64)
    inputs = make_inputs(spec, torch.device("cpu"), seed=2)
    prepared = Fa4Paged().prepare(spec, inputs)
    got = prepared.fn()
    exact = reference_attention(spec, inputs, grads=False)
    torch.testing.assert_close(got.out, exact.out.to(got.out.dtype), rtol=1e-5, atol=1e-5)
    assert prepared.info["shared_pages"] == 4 and prepared.info["cache"] == "paged, 64 tokens a page"
    table = CALLS[-1]["page_table"]
    assert (table[:, :4] == table[0, :4]).all()  # every request's first four pages are the same pages


# ---- the cache write of a serving step (Prepared.side["append"]) ------------------------------------------

def _new_rows(p, plen):
    """Rows of the packed own keys that are each request's new tokens."""
    rows, start = [], 0
    for sq, sk in zip(p.seqlens_q, p.seqlens_k):
        rows += range(start + sk - plen - sq, start + sk - plen)
        start += sk - plen
    return rows


APPEND_CASES = {
    "contiguous": (AttnSpec(batch=1, seqlens_q=(3, 1, 1), seqlens_k=(40, 9, 77), heads_q=4, heads_kv=2, head_dim=16,
                            dtype="bf16", causal=True), None),
    "pages of 16": (AttnSpec(batch=1, seqlens_q=(3, 1, 1), seqlens_k=(40, 9, 77), heads_q=4, heads_kv=2,
                             head_dim=16, dtype="bf16", causal=True), 16),
    "pages of 7": (AttnSpec(batch=1, seqlens_q=(5, 1), seqlens_k=(30, 15), heads_q=2, heads_kv=2, head_dim=16,
                            dtype="bf16", causal=True), 7),
    "shared prefix": (AttnSpec(batch=1, seqlens_q=(2, 1, 1), seqlens_k=(70, 50, 66), heads_q=2, heads_kv=2,
                               head_dim=16, dtype="bf16", causal=True, shared_prefix=32), 16),
    "fp8 per head": (AttnSpec(batch=1, seqlens_q=(3, 1), seqlens_k=(40, 21), heads_q=4, heads_kv=2, head_dim=16,
                              dtype="bf16", causal=True, kv_dtype="fp8-head"), 16),
    "mla latent rows": (AttnSpec(batch=1, seqlens_q=(1, 1), seqlens_k=(33, 70), heads_q=4, heads_kv=1, head_dim=576,
                                 head_dim_v=512, dtype="bf16", mla=True), 64),
}


@pytest.mark.parametrize("name", APPEND_CASES)
def test_the_append_step_writes_each_new_token_into_its_own_slot(name):
    """A cache built without the step's new tokens, after the append, is bit for bit the cache built with them."""
    from attnbench.backends.kernel import packed

    spec, page = APPEND_CASES[name]
    inputs = make_inputs(spec, torch.device("cpu"), seed=4)
    p = packed(spec, inputs)
    plen = 0 if inputs.prefix_k is None else inputs.prefix_k.shape[0]
    prefix = None if inputs.prefix_k is None else (inputs.prefix_k, inputs.prefix_v)
    k, v = p.flatten(inputs.k), None if spec.mla else p.flatten(inputs.v)
    full = build_cache(k, v, p.seqlens_k, page, seed=1, prefix=prefix)
    gone = _new_rows(p, plen)
    holes = [t.clone() if t is not None else None for t in (k, v)]
    for t in holes:
        if t is not None:
            t.view(torch.uint8)[gone] = 0
    cache = build_cache(*holes, p.seqlens_k, page, seed=1, prefix=prefix)
    pools = [t for t in (cache.k_cache, cache.v_cache) if t is not None]
    wanted = [t for t in (full.k_cache, full.v_cache) if t is not None]
    assert not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(pools, wanted))
    call = append_call(cache, p, k, v, inputs, page)
    call.fn()
    for a, b in zip(pools, wanted):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert call.info["tokens"] == len(gone)
    assert ("e4m3" in call.info["how"]) == (spec.kv_dtype is not None)


def test_a_serving_case_records_its_append_beside_the_attention(fake, monkeypatch):
    from attnbench.runner import Runner, RunOptions
    from attnbench.timing import TimingConfig

    fake("fa3")
    monkeypatch.setattr(sys.modules["flash_attn_interface"], "flash_attn_with_kvcache", with_kvcache, raising=False)
    monkeypatch.setattr(Fa3Paged, "capabilities", replace(Fa3Paged.declared, devices=("cuda", "cpu")))
    monkeypatch.setattr(Fa3Paged, "extra_reason", lambda self, spec, device: None)
    records = []
    spec = AttnSpec(batch=2, seqlens_q=(1,), seqlens_k=(300,), heads_q=4, heads_kv=2, head_dim=16, dtype="bf16")
    Runner(RunOptions(device="cpu", backends=("fa3-paged",), timing=TimingConfig(warmup=1, repeat=3)),
           run_id="r", env_id=None, sink=records.append).run([spec])
    (record,) = records
    assert record.status == "ok", record.reason
    append = record.info["append"]
    assert append["tokens"] == 2 and append["bytes_written"] == 2 * 2 * 2 * 16 * 2  # tokens, k and v, heads, size, bf16
    assert append["median_ms"] > 0 and append["samples"] >= 3 and append["timing"] == "cpu"


def test_an_fp8_cache_append_quantizes_the_incoming_bf16_tokens():
    """The step's tokens arrive as bf16 and are quantized on the way in (that cost is part of the append): new
    values written through the append land as their own e4m3 bits, not as a copy of bits already stored."""
    import dataclasses

    from attnbench.backends.kernel import packed
    from attnbench.inputs import to_e4m3

    spec, page = APPEND_CASES["fp8 per head"]
    inputs = make_inputs(spec, torch.device("cpu"), seed=4)
    halved = dataclasses.replace(inputs.unquantized, k=inputs.unquantized.k / 2, v=inputs.unquantized.v / 2)
    inputs = dataclasses.replace(inputs, unquantized=halved)
    p = packed(spec, inputs)
    k, v = p.flatten(inputs.k), p.flatten(inputs.v)
    cache = build_cache(k, v, p.seqlens_k, page, seed=1)
    append_call(cache, p, k, v, inputs, page).fn()
    for i, (sq, sk) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        pages = cache.block_table[i].tolist()
        stored = torch.cat(list(cache.k_cache[pages]))[sk - sq:sk]
        start = sum(p.seqlens_k[:i])
        want = to_e4m3(p.flatten(halved.k)[start + sk - sq:start + sk], inputs.descale[1])
        assert torch.equal(stored.view(torch.uint8), want.view(torch.uint8))
        assert not torch.equal(stored.view(torch.uint8), k[start + sk - sq:start + sk].view(torch.uint8))

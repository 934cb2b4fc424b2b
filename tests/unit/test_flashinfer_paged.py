"""FlashInfer's paged wrappers (flashinfer-decode, flashinfer-paged): the page metadata attnbench builds
reads every request's own tokens, and the planned call gives naive attention (stand-ins with flashinfer
0.7's signatures, fake_kernels.py; on CPU)."""

from __future__ import annotations

import fake_kernels as fk
import pytest
import torch

from attnbench.backends import registry
from attnbench.backends.flashinfer import FlashInferDecode, FlashInferPaged, page_metadata
from attnbench.backends.kvcache import build_cache
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec


def test_page_metadata_reads_each_request_in_order():
    k = torch.arange(40, dtype=torch.float32).view(40, 1, 1)
    cache = build_cache(k, k.clone(), (7, 33), page_size=4, seed=1)
    indptr, indices, last = page_metadata(cache.block_table, (7, 33), 4)
    assert indptr.tolist() == [0, 2, 11] and last.tolist() == [3, 1] and indices.dtype == torch.int32
    got = fk._paged_requests((cache.k_cache, cache.v_cache), indptr, indices, last)
    assert got[0][0].flatten().tolist() == list(range(7)) and got[1][0].flatten().tolist() == list(range(7, 40))


@pytest.mark.parametrize("backend, spec", [
    (FlashInferDecode(page_size=16), AttnSpec(batch=1, seqlens_q=(1, 1, 1), seqlens_k=(17, 300, 64), heads_q=8,
                                              heads_kv=2, head_dim=64, dtype="fp32")),
    (FlashInferDecode(page_size=64), AttnSpec(batch=3, seqlens_q=(1,), seqlens_k=(130,), heads_q=4, head_dim=64,
                                              dtype="fp32", causal=True)),
    (FlashInferPaged(page_size=16), AttnSpec(batch=1, seqlens_q=(5, 40), seqlens_k=(77, 40), heads_q=8, heads_kv=2,
                                             head_dim=64, dtype="fp32", causal=True)),
    (FlashInferPaged(page_size=64), AttnSpec(batch=2, seqlens_q=(16,), seqlens_k=(200,), heads_q=4, head_dim=64,
                                             dtype="fp32")),
], ids=["decode-16", "decode-64-causal", "prefill-16-causal", "prefill-64"])
def test_the_paged_call_gives_naive_attention(fake, backend, spec):
    fake("flashinfer")
    inputs = make_inputs(spec, seed=3)
    got = backend.prepare(spec, inputs).checked_call()
    want = registry.get("naive").prepare(spec, inputs).fn()
    torch.testing.assert_close(got.out, want.out, rtol=1e-5, atol=1e-5)
    assert got.lse is None  # FlashInfer's LSE is base 2 by default: not handed to the check


def test_what_the_paged_wrappers_refuse(fake):
    fake("flashinfer")
    two = AttnSpec(batch=2, seqlens_q=(2,), seqlens_k=(100,), heads_q=4, head_dim=64, dtype="bf16")
    assert "one new query per request" in FlashInferDecode().supports(two, "cuda")
    assert FlashInferPaged().extra_reason(two, "cuda") is None
    more = two.replace(seqlens_q=(200,))
    assert "more new queries than cached keys" in FlashInferPaged().extra_reason(more, "cuda")
    assert "head size 96" in FlashInferPaged().supports(two.replace(head_dim=96), "cuda")


def test_decode_takes_flashinfers_tensor_core_kernel_when_asked(fake):
    fake("flashinfer")
    spec = AttnSpec(batch=2, seqlens_q=(1,), seqlens_k=(100,), heads_q=8, heads_kv=1, head_dim=64, dtype="fp32")
    inputs = make_inputs(spec, seed=3)
    FlashInferDecode().prepare(spec, inputs)
    prepared = FlashInferDecode(use_tensor_cores=True).prepare(spec, inputs)
    assert [c["use_tensor_cores"] for c in fk.calls("decode.init")] == [False, True]
    assert prepared.info["use_tensor_cores"] is True

"""FlexAttention on CPU: mask functions and block masks against the dense reference masks, and flex
itself (eager, and through torch.compile with a fast dynamo backend) against the naive backend.
Inductor on CPU takes 20-40 s per shape here, so the compiled-inductor path is left to the GPU tests."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnbench.backends import registry
from attnbench.backends.flex import FlexBackend, block_mask, dense_mask_mod, document_mask_mod
from attnbench.inputs import make_inputs
from attnbench.masks import keep_mask
from attnbench.spec import AttnSpec


def grid(mod, q_len, kv_len):
    i = torch.arange(q_len)[:, None]
    j = torch.arange(kv_len)[None, :]
    return mod(0, 0, i, j).expand(q_len, kv_len)


@pytest.mark.parametrize("sq, sk, causal, window", [
    (17, 17, True, None), (17, 77, True, None), (77, 17, True, None), (77, 77, False, (5, 3)),
    (33, 77, True, (9, -1)), (77, 33, False, (-1, 4)),
])
def test_dense_mask_mod_equals_keep_mask(sq, sk, causal, window):
    spec = AttnSpec(seqlens_q=(sq,), seqlens_k=(sk,), causal=causal, window=window)
    from attnbench.backends.kernel import effective_window
    mod = dense_mask_mod(sq, sk, *effective_window(spec))
    assert torch.equal(grid(mod, sq, sk), keep_mask(sq, sk, causal, window))


def test_no_mask_means_no_mask_mod():
    assert dense_mask_mod(17, 33, -1, -1) is None


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (4, 2)), (False, (3, 3))])
def test_document_mask_is_block_diagonal_of_per_sequence_masks(causal, window):
    seqs = ((17, 9), (5, 5), (33, 40))
    spec = AttnSpec(seqlens_q=tuple(s for s, _ in seqs), seqlens_k=tuple(s for _, s in seqs), causal=causal,
                    window=window)
    from attnbench.backends.kernel import effective_window
    got = grid(document_mask_mod(seqs, *effective_window(spec), "cpu"), 55, 54)
    want = torch.zeros(55, 54, dtype=torch.bool)
    a = c = 0
    for sq, sk in seqs:
        part = keep_mask(sq, sk, causal, window)
        want[a:a + sq, c:c + sk] = True if part is None else part
        a, c = a + sq, c + sk
    assert torch.equal(got, want)


def test_block_masks_are_built_once_and_cached():
    block_mask.cache_clear()
    first = block_mask(((77, 77),), False, (-1, 0), "cpu")
    again = block_mask(((77, 77),), False, (-1, 0), "cpu")
    assert first is again and block_mask.cache_info().hits == 1
    assert block_mask(((77, 77),), False, (-1, -1), "cpu") is None
    assert tuple(first.shape[-2:]) == (77, 77)
    dense = first.to_dense()  # (1, 1, q_blocks, kv_blocks) with the default 128 block
    assert dense.shape[-2:] == (1, 1) and int(dense.sum()) == 1


CASES = [
    AttnSpec(batch=2, seqlens_q=(17,), seqlens_k=(77,), heads_q=4, heads_kv=2, head_dim=16, dtype="fp64", causal=True),
    AttnSpec(batch=1, seqlens_q=(77,), heads_q=2, head_dim=8, dtype="fp64", window=(5, 3)),
    AttnSpec(batch=2, seqlens_q=(17, 5, 33), seqlens_k=(9, 5, 40), heads_q=4, heads_kv=1, head_dim=8, dtype="fp64",
             causal=True),
]


@pytest.mark.parametrize("spec", CASES, ids=["gqa-causal-cross", "window", "varlen-causal"])
def test_eager_flex_on_cpu_matches_naive(spec):
    backend = FlexBackend(compile=False, cpu=True)
    assert backend.supports(spec, "cpu") is None
    inputs = make_inputs(spec, "cpu", seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        prepared = backend.prepare(spec, inputs)
    ref = registry.get("naive").prepare(spec, inputs).fn()
    torch.testing.assert_close(prepared.fn().out, ref.out, rtol=1e-10, atol=1e-10)
    assert "first_call_ms" in prepared.info and prepared.info["kernel"] == "flex_attention (eager)"


def test_compiled_flex_records_compile_time_outside_the_closure():
    spec = CASES[2]
    backend = FlexBackend(compile_backend="aot_eager", cpu=True)
    inputs = make_inputs(spec, "cpu", seed=6)
    prepared = backend.prepare(spec, inputs)
    assert prepared.info["compile_ms"] > 0 and "torch.compile aot_eager" in prepared.info["kernel"]
    assert prepared.info["mask"].startswith("document block mask")
    ref = registry.get("naive").prepare(spec, inputs).fn()
    torch.testing.assert_close(prepared.fn().out, ref.out, rtol=1e-10, atol=1e-10)


def test_flex_support_answers_on_cpu():
    spec = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")
    assert "runs on cuda" in registry.get("flex").supports(spec, "cpu")  # CPU compile too slow for sweeps
    assert "no backward on CPU" in FlexBackend(cpu=True).supports(spec.replace(pass_="fwd_bwd"), "cpu")
    assert "fp64" in registry.get("flex").extra_reason(spec.replace(dtype="fp64"), "cuda")

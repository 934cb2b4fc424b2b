"""flex-sparse: block maps at a target sparsity, exact FLOP bookkeeping, backend options."""

import math

import numpy as np
import pytest
import torch

from attnbench.backends import options, registry
from attnbench.backends.flex_sparse import (
    FlexSparse,
    block_map,
    block_pair_counts,
    full_blocks,
    sparse_stats,
)
from attnbench.masks import keep_mask
from attnbench.spec import AttnSpec

SHAPES = [(77, 77, False), (77, 77, True), (130, 577, True), (577, 130, True), (200, 333, False), (17, 17, True)]


def _dense(sq, sk, causal):
    keep = keep_mask(sq, sk, causal)
    return torch.ones(sq, sk, dtype=torch.bool) if keep is None else keep


@pytest.mark.parametrize("sq,sk,causal", SHAPES)
def test_block_pair_counts_match_the_dense_mask(sq, sk, causal):
    block = 32
    counts = block_pair_counts(sq, sk, block, causal)
    dense = _dense(sq, sk, causal)
    n_q, n_kv = math.ceil(sq / block), math.ceil(sk / block)
    expected = np.array([[int(dense[i * block:(i + 1) * block, j * block:(j + 1) * block].sum()) for j in range(n_kv)]
                         for i in range(n_q)])
    assert counts.shape == (n_q, n_kv) and (counts == expected).all()
    assert (full_blocks(sq, sk, block, causal) == (expected == block * block)).all()


@pytest.mark.parametrize("pattern", ["random", "local", "strided"])
@pytest.mark.parametrize("sq,sk,causal", SHAPES)
def test_effective_flops_count_exactly_the_attended_blocks(pattern, sq, sk, causal):
    block, heads, batch = 16, 3, 2
    spec = AttnSpec(batch=batch, seqlens_q=(sq,), seqlens_k=(sk,), heads_q=heads, head_dim=8, head_dim_v=24,
                    causal=causal, dtype="fp32")
    kept = block_map(heads, sq, sk, block=block, sparsity=0.6, pattern=pattern, causal=causal, seed=3)
    # Expand the block map to pairs (only in the test) and intersect with the base mask.
    pairs = kept.repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :sq, :sk] & _dense(sq, sk, causal)
    stats = sparse_stats(spec, kept, block)
    assert stats["effective_flops"] == 2 * (8 + 24) * batch * int(pairs.sum())
    assert stats["dense_flops"] == 2 * (8 + 24) * heads * batch * sq * sk
    allowed = torch.from_numpy(block_pair_counts(sq, sk, block, causal) > 0)
    assert not (kept & ~allowed).any()  # never a block the mask forbids
    assert stats["sparsity"] == pytest.approx(1 - kept.sum().item() / (heads * allowed.sum().item()))
    rows_with_keys = allowed.any(-1)
    assert kept.any(-1)[:, rows_with_keys].all()  # every query block that may attend keeps a block


def test_target_sparsity_is_met_up_to_rounding_and_seeded():
    a = block_map(4, 4096, 4096, block=128, sparsity=0.9, pattern="random", causal=False, seed=1)
    b = block_map(4, 4096, 4096, block=128, sparsity=0.9, pattern="random", causal=False, seed=1)
    c = block_map(4, 4096, 4096, block=128, sparsity=0.9, pattern="random", causal=False, seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 1 - a.float().mean().item() == pytest.approx(0.9, abs=1 / 32)
    local = block_map(1, 1024, 1024, block=128, sparsity=0.5, pattern="local", causal=True)
    assert local[0, 2:, 0].all() and local[0].diagonal().all()  # sink (where 2+ blocks are kept) and diagonal


def test_bwd_flops_scale_with_the_pass():
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, causal=True, dtype="fp32")
    kept = block_map(2, 100, 100, block=32, sparsity=0.0, pattern="random", causal=True)
    fwd = sparse_stats(spec, kept, 32)
    bwd = sparse_stats(spec.replace(pass_="fwd_bwd"), kept, 32)
    assert fwd["effective_flops"] == fwd["exact_flops"] and fwd["sparsity"] == 0.0
    assert bwd["effective_flops"] == pytest.approx(3.5 * fwd["effective_flops"])


def test_constructor_and_cpu_backward_reasons():
    with pytest.raises(ValueError, match="sparsity"):
        FlexSparse(sparsity=0.99)
    with pytest.raises(ValueError, match="pattern"):
        FlexSparse(pattern="diagonal")
    backend = FlexSparse()
    assert not backend.capabilities.exact
    assert "backward on CPU" in backend.supports(AttnSpec(pass_="fwd_bwd", dtype="fp32"), "cpu")


def test_backend_opt_configures_the_backend_it_names(monkeypatch):
    monkeypatch.setattr(registry, "_extra", {})
    assert options.parse(["flex-sparse.sparsity=0.25", "flex-sparse.pattern=local"]) == \
        {"flex-sparse": {"sparsity": 0.25, "pattern": "local"}}
    got = options.resolve(["flex-sparse.sparsity=0.25", "flex-sparse.pattern=local"])
    backend = registry.get("flex-sparse", got["flex-sparse"])
    assert (backend.sparsity, backend.pattern) == (0.25, "local")
    for bad, match in (("flex-sparse.sparsity", "BACKEND.KEY=VALUE"), ("nope.x=1", "unknown backend"),
                       ("flex-sparse.sparsity=2", "sparsity"), ("flex-sparse.colour=red", "colour")):
        with pytest.raises(ValueError, match=match):
            options.resolve([bad])


def test_flex_sparse_forward_on_cpu_matches_the_block_masked_reference():
    """Compiled FlexAttention runs forward on CPU in torch >= 2.5 (no backward there)."""
    from attnbench.inputs import make_inputs
    spec = AttnSpec(batch=1, seqlens_q=(150,), seqlens_k=(200,), heads_q=4, heads_kv=2, head_dim=16, causal=True,
                    dtype="fp32")
    backend = FlexSparse(sparsity=0.5, pattern="strided", block=32)
    inputs = make_inputs(spec)
    try:
        prepared = backend.prepare(spec, inputs)
        out = prepared.fn().out
    except Exception as exc:  # no C++ compiler for inductor, or no CPU flex in this torch
        pytest.skip(f"FlexAttention does not compile on this CPU: {type(exc).__name__}: {exc}")
    _, kept = backend.block_mask(spec, "cpu")
    keep = kept.repeat_interleave(32, 1).repeat_interleave(32, 2)[:, :150, :200] & _dense(150, 200, True)
    q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2) * spec.softmax_scale).masked_fill(~keep[None], float("-inf"))
    ref = (scores.softmax(-1).nan_to_num() @ v).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert 0.3 < prepared.info["sparsity"] < 0.7 and prepared.info["effective_flops"] < prepared.info["exact_flops"]


def test_sage_tradeoff_plot_writes_a_png(tmp_path):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sage_tradeoff.py"
    spec = importlib.util.spec_from_file_location("sage_tradeoff", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"name": n, "seq": s, "causal": c, "median_ms": s / 1000 * (2 if n == "sage" else 1), "tflops": 100.0,
             "rel_l1": 1e-3} for n in ("sdpa-flash", "sage", "sage-quant", "sage-kernel") for s in (1024, 4096)
            for c in (False, True)]
    mod.plot(rows, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 1000

"""What every registered backend says it can run (answered from declarations, without running it),
and the packing helpers the adapters share."""

from __future__ import annotations

import pytest
import torch

from attnbench.backends import registry
from attnbench.backends.base import check_capabilities
from attnbench.backends.kernel import effective_window, packed
from attnbench.inputs import cu_seqlens, make_inputs, pack_kv, pack_qkv, split_varlen
from attnbench.spec import AttnSpec

BASE = dict(batch=2, seqlens_q=(128,), heads_q=8, head_dim=128, dtype="bf16")
CASES = {
    "dense": AttnSpec(**BASE),
    "gqa": AttnSpec(**BASE | {"heads_kv": 2}),
    "varlen": AttnSpec(**BASE | {"seqlens_q": (128, 256)}),
    "window": AttnSpec(**BASE | {"window": (64, 0)}),
    "bwd": AttnSpec(**BASE | {"pass_": "fwd_bwd"}),
    "fp32": AttnSpec(**BASE | {"dtype": "fp32"}),
    "d80": AttnSpec(**BASE | {"head_dim": 80}),
    "cross_causal": AttnSpec(**BASE | {"seqlens_k": (256,), "causal": True}),
    "more_q_causal": AttnSpec(**BASE | {"seqlens_q": (256,), "seqlens_k": (128,), "causal": True}),
    "short": AttnSpec(**BASE | {"seqlens_q": (64,)}),
}
ALL = set(CASES)
# Which cases each backend accepts on a CUDA device (package availability aside).
SUPPORTED = {
    "naive": ALL,
    "sdpa-math": ALL,  # grouped cases run one SDPA call per sequence
    "sdpa-flash": ALL - {"varlen", "window", "fp32"},
    "sdpa-efficient": ALL - {"varlen"},
    "sdpa-cudnn": ALL - {"varlen", "window", "fp32"},
    "sdpa-varlen": ALL - {"fp32"},
    "flex": ALL,
    "fa2": ALL - {"varlen", "fp32"},
    "fa2-qkvpacked": ALL - {"gqa", "varlen", "fp32", "cross_causal", "more_q_causal"},
    "fa2-kvpacked": ALL - {"varlen", "fp32"},
    "fa2-varlen": ALL - {"fp32"},
    "fa2-varlen-qkvpacked": ALL - {"gqa", "fp32", "cross_causal", "more_q_causal"},
    "fa3": ALL - {"varlen", "fp32"},
    "fa3-varlen": ALL - {"fp32"},
    "fa4": ALL - {"varlen", "fp32"},
    "fa4-varlen": ALL - {"fp32"},
    "xformers": ALL - {"more_q_causal"},
    "sage": {"dense", "gqa", "short"},
    "sage-varlen": {"dense", "gqa", "varlen", "short"},
    "sage2-fp8": {"dense", "gqa", "short", "d80"},
    "sage2-fp8-sm90": {"dense", "gqa", "short", "d80"},
    "sage2-fp16": {"dense", "gqa", "short", "d80"},
    "sparge": {"dense"},
    "sparge-cdf": {"dense"},
    "flashinfer": ALL - {"bwd", "fp32", "d80"},
}


def test_every_backend_in_the_table_is_registered():
    assert not set(SUPPORTED) - set(registry.BUILTIN)
    # the adapters of this table are all there (other built-ins may be added beside them)
    assert {"flex", "sdpa-varlen", "fa2", "fa3", "fa4", "xformers", "sage", "sparge", "flashinfer"} <= set(SUPPORTED)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_supports_answers_from_declared_capabilities(name):
    backend = registry.get(name)
    for case, spec in CASES.items():
        reason = check_capabilities(backend.capabilities, spec, "cuda") or backend.extra_reason(spec, "cuda")
        if case in SUPPORTED[name]:
            assert reason is None, f"{name} should run {case}: {reason}"
        else:
            assert isinstance(reason, str) and reason, f"{name} should refuse {case}"


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_backends_that_cannot_run_here_say_why(name):
    backend = registry.get(name)
    reason = backend.supports(CASES["dense"], "cpu")
    if reason is not None:
        assert "not importable" in reason or "runs on" in reason or "no " in reason, reason
    else:
        assert "cpu" in backend.capabilities.devices
    assert backend.description and backend.capabilities.devices


def test_approximate_and_forward_only_kernels_are_declared():
    for name in ("sage", "sage-varlen", "sage2-fp8", "sparge", "sparge-cdf"):
        caps = registry.get(name).capabilities
        assert caps.exact is False and caps.backward is False, name
    assert registry.get("flashinfer").capabilities.backward is False
    assert registry.get("fa3").capabilities.min_compute_capability == (9, 0)
    assert registry.get("fa4").capabilities.min_compute_capability == (9, 0)


@pytest.mark.parametrize("causal, window, want", [
    (False, None, (-1, -1)), (True, None, (-1, 0)), (True, (5, 3), (5, 0)), (True, (-1, -1), (-1, 0)),
    (False, (5, 3), (5, 3)), (True, (4, -1), (4, 0)),
])
def test_effective_window_folds_causal_like_keep_mask(causal, window, want):
    assert effective_window(AttnSpec(seqlens_q=(9,), causal=causal, window=window)) == want


# ---- packing helpers ------------------------------------------------------------------------------
def test_qkv_and_kv_packing_round_trip():
    spec = AttnSpec(batch=2, seqlens_q=(17,), heads_q=3, head_dim=8, dtype="fp32")
    x = make_inputs(spec, "cpu", seed=1)
    qkv = pack_qkv(x.q, x.k, x.v)
    assert qkv.shape == (2, 17, 3, 3, 8)
    for got, want in zip(qkv.unbind(dim=-3), (x.q, x.k, x.v), strict=True):
        assert torch.equal(got, want)
    k, v = pack_kv(x.k, x.v).unbind(dim=-3)
    assert torch.equal(k, x.k) and torch.equal(v, x.v)
    with pytest.raises(ValueError, match="equal shapes"):
        pack_qkv(x.q, x.k[:, :5], x.v)


def test_cu_seqlens_and_split_round_trip():
    spec = AttnSpec(batch=2, seqlens_q=(17, 5, 33), seqlens_k=(9, 5, 1), heads_q=2, head_dim=8, dtype="fp32")
    x = make_inputs(spec, "cpu", seed=2)
    assert x.cu_seqlens_q.tolist() == [0, 17, 22, 55, 72, 77, 110] and x.cu_seqlens_q.dtype == torch.int32
    assert cu_seqlens([9, 5, 1], "cpu").tolist() == [0, 9, 14, 15]
    parts = split_varlen(x.q, x.cu_seqlens_q)
    assert [p.shape[0] for p in parts] == [17, 5, 33] * 2
    assert torch.equal(torch.cat(parts), x.q)
    p = packed(spec, x)
    assert p.batch is None and p.flatten(x.q) is x.q and p.seqlens_k == (9, 5, 1) * 2 and p.max_seqlen_k == 9


def test_dense_flattening_round_trip():
    spec = AttnSpec(batch=3, seqlens_q=(7,), seqlens_k=(11,), heads_q=2, head_dim=4, dtype="fp32", layout="bhsd")
    x = make_inputs(spec, "cpu", seed=3)
    p = packed(spec, x)
    assert p.cu_seqlens_q.tolist() == [0, 7, 14, 21] and p.cu_seqlens_k.tolist() == [0, 11, 22, 33]
    flat = p.flatten(x.q)
    assert flat.shape == (21, 2, 4) and torch.equal(p.unflatten(flat), x.q)
    lse = torch.arange(2 * 21, dtype=torch.float32).view(2, 21)  # (H, B*S) as varlen kernels give it
    back = p.unflatten_lse(lse)
    assert back.shape == (3, 2, 7) and back[1, 0, 2] == lse[0, 7 + 2] and back[2, 1, 6] == lse[1, 14 + 6]

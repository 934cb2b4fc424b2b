"""Built-in backends compute the same function (fp64 on CPU, odd sizes, masks, GQA, varlen)."""

import pytest
import torch

from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

CPU_BACKENDS = ["naive", "sdpa-math", "sdpa-flash"]


def run(backend_name, spec, seed=3):
    backend = registry.get(backend_name)
    reason = backend.supports(spec, "cpu")
    if reason:
        pytest.skip(f"{backend_name}: {reason}")
    inputs = make_inputs(spec, "cpu", seed=seed)
    return backend.prepare(spec, inputs).fn()


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd", "bwd"])
@pytest.mark.parametrize("sq, sk, causal, hq, hkv", [
    (17, 17, False, 3, 3), (77, 77, True, 4, 2), (17, 77, True, 2, 1), (77, 17, True, 2, 2), (577, 577, True, 2, 2),
])
def test_dense_backends_agree_in_fp64(pass_, sq, sk, causal, hq, hkv):
    spec = AttnSpec(batch=2, seqlens_q=(sq,), seqlens_k=(sk,), heads_q=hq, heads_kv=hkv, head_dim=16,
                    dtype="fp64", causal=causal, pass_=pass_)
    ref = run("naive", spec)
    for name in CPU_BACKENDS[1:]:
        got = run(name, spec)
        for key, t in ref.tensors().items():
            if key == "lse":
                continue
            torch.testing.assert_close(getattr(got, key), t, rtol=1e-9, atol=1e-9, msg=f"{name} {key}")


def test_window_agrees_between_naive_and_sdpa_math():
    spec = AttnSpec(batch=1, seqlens_q=(77,), heads_q=2, head_dim=8, dtype="fp64", window=(5, 3), pass_="fwd_bwd")
    a, b = run("naive", spec), run("sdpa-math", spec)
    torch.testing.assert_close(a.out, b.out)
    torch.testing.assert_close(a.dk, b.dk)


def test_naive_varlen_equals_per_sequence_dense():
    spec = AttnSpec(batch=1, seqlens_q=(17, 5, 33), heads_q=2, head_dim=8, dtype="fp64", causal=True)
    inputs = make_inputs(spec, "cpu", seed=1)
    out = registry.get("naive").prepare(spec, inputs).fn().out
    cu = inputs.cu_seqlens_q.tolist()
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        s = b - a
        dense = AttnSpec(seqlens_q=(s,), heads_q=2, head_dim=8, dtype="fp64", causal=True)
        from attnbench.inputs import AttnInputs
        sub = AttnInputs(q=inputs.q[None, a:b], k=inputs.k[None, a:b], v=inputs.v[None, a:b],
                         dout=inputs.dout[None, a:b], max_seqlen_q=s, max_seqlen_k=s)
        torch.testing.assert_close(out[a:b], registry.get("sdpa-math").prepare(dense, sub).fn().out[0])


def test_rows_without_keys_are_zero_not_nan():
    spec = AttnSpec(seqlens_q=(9,), seqlens_k=(4,), heads_q=1, head_dim=4, dtype="fp64", causal=True)
    out = run("naive", spec).out
    assert torch.isfinite(out).all()
    assert (out[0, :5] == 0).all() and (out[0, 5:] != 0).any()


def test_unsupported_cases_give_reasons():
    assert "varlen" in registry.get("sdpa-flash").supports(AttnSpec(seqlens_q=(4, 8)), "cpu")
    assert "cuda" in registry.get("sdpa-cudnn").supports(AttnSpec(), "cpu")
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        registry.get("nope")


def test_inputs_are_seeded_random_not_zero():
    spec = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")
    a, b = make_inputs(spec, "cpu", seed=5), make_inputs(spec, "cpu", seed=5)
    assert torch.equal(a.q, b.q) and a.q.abs().sum() > 0
    assert not torch.equal(a.q, make_inputs(spec, "cpu", seed=6).q)
    assert not torch.equal(a.q, a.k)


def test_bhsd_layout_is_a_bshd_view_of_the_same_values():
    spec = AttnSpec(seqlens_q=(17,), heads_q=3, head_dim=8, dtype="fp64", layout="bhsd")
    inputs = make_inputs(spec, "cpu")
    assert inputs.q.shape == (1, 17, 3, 8) and inputs.q.transpose(1, 2).is_contiguous()

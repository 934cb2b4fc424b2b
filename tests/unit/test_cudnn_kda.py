"""The cuDNN KDA backend on the CPU: its refusals in one line, and its call (packed tokens, int32 offsets, fp32 gates,
the state handed and returned V-major) against a fake ``cudnn.linear_attention`` that computes the recurrence its
source documents with exact, differentiable maths; forward and backward agree with the reference, and a fake that
reads the state K-major, or maps value heads to the wrong q/k head, fails the same comparison."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backends.registry import get as get_backend
from attnbench.linear import cudnn_kda
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import l2norm, reference
from attnbench.linear.spec import RecurrenceSpec


def _fake_cudnn(monkeypatch, *, v_major=True, head_of=lambda hv, group, heads: hv // group):
    calls = []

    def kimi_delta_attention(q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
                             use_qk_l2norm_in_kernel=False, plan_name=None, **rest):
        # the contract read from the wheel: THD, int32/int64 offsets, log-space per-channel g (T, HV, K), post-sigmoid
        # beta (T, HV), states (N, HV, V, K)
        assert q.dim() == k.dim() == v.dim() == 3 and q.dtype == k.dtype == v.dtype == torch.bfloat16
        assert g.dtype == beta.dtype == torch.float32 and g.shape == (*v.shape[:2], q.shape[-1])
        assert cu_seqlens.dtype == torch.int32 and cu_seqlens.dim() == 1 and not rest
        calls.append({"plan_name": plan_name, "offsets": cu_seqlens.tolist()})
        heads, hv = q.shape[1], v.shape[1]
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        idx = [head_of(h, hv // heads, heads) for h in range(hv)]
        q, k = q[:, idx].double(), k[:, idx].double()
        outs, states = [], []
        for n, (a, e) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
            s = torch.zeros(hv, 128, 128, dtype=torch.float64)  # (HV, K, V) inside
            if initial_state is not None:
                s = initial_state[n].double().transpose(-1, -2) if v_major else initial_state[n].double()
            for t in range(a, e):
                s = torch.exp(g[t].double())[:, :, None] * s
                u = beta[t].double()[:, None] * (v[t].double() - torch.einsum("hkv,hk->hv", s, k[t]))
                s = s + k[t][:, :, None] * u[:, None, :]
                outs.append(scale * torch.einsum("hkv,hk->hv", s, q[t]))
            states.append(s.transpose(-1, -2) if v_major else s)
        return torch.stack(outs).to(v.dtype), torch.stack(states).float()

    la = types.ModuleType("cudnn.linear_attention")
    la.kimi_delta_attention = kimi_delta_attention
    pkg = types.ModuleType("cudnn")
    pkg.linear_attention = la
    monkeypatch.setitem(sys.modules, "cudnn", pkg)
    monkeypatch.setitem(sys.modules, "cudnn.linear_attention", la)
    return calls


def _close(got, want, tol=3e-2):
    return torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)


CASE = dict(kind="kda", batch=2, seqlens=(4,), heads_qk=2, heads_v=2, d_k=128, initial_state=True, dtype="bf16")


@pytest.mark.parametrize("extra", [{}, {"heads_qk": 1, "heads_v": 2}, {"batch": 1, "seqlens": (3, 2)},
                                   {"pass_": "fwd_bwd", "l2norm": False},
                                   {"batch": 1, "seqlens": (3, 2), "pass_": "fwd_bwd", "l2norm": False},
                                   {"initial_state": False}])
def test_cudnn_kda_matches_the_reference_through_a_faithful_fake(monkeypatch, extra):
    calls = _fake_cudnn(monkeypatch)
    spec = RecurrenceSpec(**{**CASE, **extra})
    inputs = make_inputs(spec)
    got, want = cudnn_kda.prepare(spec, inputs)(), reference(spec, inputs)
    names = ["out", "final_state"] + ([f"d{n}" for n in spec.input_names] if spec.pass_ == "fwd_bwd" else [])
    for name in names:
        assert got[name].shape == want[name].shape, name
        assert _close(got[name], want[name]), name
    ends = [0, 3, 5] if len(spec.seqlens) > 1 else [0, 4, 8][:spec.batch + 1]
    assert calls[-1] == {"plan_name": None, "offsets": ends}


@pytest.mark.parametrize("wrong", [{"v_major": False}, {"head_of": lambda hv, group, heads: hv % heads}])
def test_a_fake_reading_the_state_or_the_heads_wrongly_fails_the_comparison(monkeypatch, wrong):
    _fake_cudnn(monkeypatch, **wrong)
    spec = RecurrenceSpec(**{**CASE, "heads_qk": 2, "heads_v": 4})
    inputs = make_inputs(spec)
    got, want = cudnn_kda.prepare(spec, inputs)(), reference(spec, inputs)
    assert not (_close(got["out"], want["out"]) and _close(got["final_state"], want["final_state"]))


def test_the_plan_option_pins_an_engine_by_name(monkeypatch):
    calls = _fake_cudnn(monkeypatch)
    spec = RecurrenceSpec(**CASE)
    cudnn_kda.prepare(spec, make_inputs(spec), plan="kda_hopper_cuda")()
    assert calls[-1]["plan_name"] == "kda_hopper_cuda"
    with pytest.raises(ValueError, match="plan must be one of auto, kda_hopper_cuda, kda_hopper"):
        cudnn_kda.prepare(spec, make_inputs(spec), plan="frost")


@pytest.mark.parametrize("change, needle", [
    ({"kind": "gdn"}, "runs kda, not gdn (its gdn and mamba2 engines are Blackwell-only)"),
    ({"decode": True, "seqlens": (1,)}, "no one-token KDA kernel"),
    ({"d_k": 64, "d_v": 64}, "d_k = d_v = 128, not 64/64"),
    ({"dtype": "fp16"}, "bf16 q, k, v, not fp16"),
    ({"pass_": "fwd_bwd", "l2norm": False, "heads_qk": 1}, "as many value heads as q/k heads, not 1/2"),
    ({"pass_": "fwd_bwd"}, "already L2-normalised"),
    ({"pass_": "fwd_bwd", "l2norm": False, "scale": 0.1}, "bakes in the scale 1/sqrt(128), not 0.1"),
])
def test_cudnn_kda_refuses_what_it_cannot_run_in_one_line(change, needle):
    why = cudnn_kda.case_reason(RecurrenceSpec(**{**CASE, **change}))
    assert why is not None and needle in why and "\n" not in why


def test_cudnn_kda_takes_hopper_only_and_is_listed():
    assert cudnn_kda.arch_reason((9, 0)) is None
    assert "sm90 (its Hopper engines) only, not sm100" in cudnn_kda.arch_reason((10, 0))
    backend = get_backend("cudnn-kda")
    assert backend.operator == "recurrence" and backend.distribution == "nvidia-cudnn-frontend"
    assert get_backend("cudnn-kda", {"plan": "kda_hopper"}).plan == "kda_hopper"

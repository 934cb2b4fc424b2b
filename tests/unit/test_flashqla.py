"""The FlashQLA backend on the CPU: its refusals in one line, and its call (fla's layouts, g = 0 for an ungated
case, the state (N, HV, K, V)) against a fake ``flash_qla`` that computes the recurrence its source documents with
exact, differentiable maths; forward and backward agree with the reference, and a fake that maps value heads to
the wrong q/k head fails the same comparison."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backends.registry import get as get_backend
from attnbench.linear import flashqla
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import l2norm, reference
from attnbench.linear.spec import RecurrenceSpec


def _fake_flash_qla(monkeypatch, *, head_of=lambda hv, group, heads: hv // group):
    calls = []

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False,
                               state_v_first=False, auto_cp=True, enable_fwd_cp_cache=True, cp_context=None,
                               force_intra_cp=False):
        assert q.dtype == k.dtype == v.dtype and q.shape[-1] == v.shape[-1] == 128 and g.dtype == torch.float32
        calls.append({"auto_cp": auto_cp, "cu_seqlens": cu_seqlens})
        b, _, heads, _ = q.shape
        hv = v.shape[2]
        group = hv // heads
        q, k = q.double(), k.double()  # computed in high precision throughout, the norm included, as the kernel's fp32
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        idx = [head_of(h, group, heads) for h in range(hv)]
        q, k = q[:, :, idx], k[:, :, idx]
        spans = ([(0, q.shape[1])] * b if cu_seqlens is None else
                 list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())))
        outs, states = [], []
        for n, (a, e) in enumerate(spans):
            bi = 0 if cu_seqlens is not None else n
            s = (torch.zeros(hv, 128, 128, dtype=torch.float64) if initial_state is None
                 else initial_state[n].double())
            for t in range(a, e):
                s = torch.exp(g[bi, t].double())[:, None, None] * s
                u = beta[bi, t].double()[:, None] * (v[bi, t].double() - torch.einsum("hkv,hk->hv", s, k[bi, t]))
                s = s + k[bi, t][:, :, None] * u[:, None, :]
                outs.append(((bi, t), scale * torch.einsum("hkv,hk->hv", s, q[bi, t])))
            states.append(s)
        out = torch.stack([o for _, o in outs]).reshape(v.shape).to(v.dtype)
        return out, torch.stack(states).float()

    monkeypatch.setitem(sys.modules, "flash_qla", types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule))
    return calls


def _close(got, want, tol=3e-2):
    return torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)


CASE = dict(kind="gdn", batch=2, seqlens=(4,), heads_qk=1, heads_v=2, d_k=128, initial_state=True, dtype="bf16")


@pytest.mark.parametrize("extra", [{}, {"pass_": "fwd_bwd"}, {"batch": 1, "seqlens": (3, 2), "pass_": "fwd_bwd"},
                                   {"gated": False, "initial_state": False}])
def test_flashqla_matches_the_reference_through_a_faithful_fake(monkeypatch, extra):
    calls = _fake_flash_qla(monkeypatch)
    spec = RecurrenceSpec(**{**CASE, **extra})
    inputs = make_inputs(spec)
    got, want = flashqla.prepare(spec, inputs)(), reference(spec, inputs)
    names = ["out", "final_state"] + ([f"d{n}" for n in spec.input_names] if spec.pass_ == "fwd_bwd" else [])
    for name in names:
        assert got[name].shape == want[name].shape, name
        assert _close(got[name], want[name]), name
    assert calls[-1]["auto_cp"] is True and (calls[-1]["cu_seqlens"] is not None) == (len(spec.seqlens) > 1)


def test_a_fake_reading_the_wrong_qk_head_fails_the_comparison(monkeypatch):
    _fake_flash_qla(monkeypatch, head_of=lambda hv, group, heads: hv % heads)
    spec = RecurrenceSpec(**{**CASE, "heads_qk": 2, "heads_v": 4})
    inputs = make_inputs(spec)
    got, want = flashqla.prepare(spec, inputs)(), reference(spec, inputs)
    assert not _close(got["out"], want["out"])


@pytest.mark.parametrize("change, needle", [
    ({"kind": "kda"}, "FlashQLA runs gdn, not kda"),
    ({"decode": True, "seqlens": (1,)}, "no decode kernel"),
    ({"d_k": 64, "d_v": 64}, "d_k = d_v = 128, not 64/64"),
    ({"dtype": "fp32"}, "fp16 or bf16, not fp32"),
])
def test_flashqla_refuses_what_it_cannot_run_in_one_line(change, needle):
    why = flashqla.case_reason(RecurrenceSpec(**{**CASE, **change}))
    assert why is not None and needle in why and "\n" not in why


def test_flashqla_on_each_architecture_runs_its_own_chunk():
    spec = RecurrenceSpec(**{**CASE, "chunk": 64})
    assert flashqla.arch_reason(spec, (9, 0)) is None and flashqla.arch_reason(spec, (10, 0)) is None
    assert "chunks of 32 tokens on sm120" in flashqla.arch_reason(spec, (12, 0))
    assert "not sm80" in flashqla.arch_reason(spec, (8, 0))
    assert "chunks of 64 tokens on sm90, not 32" in flashqla.arch_reason(spec.replace(chunk=32), (9, 0))


def test_the_backend_takes_auto_cp_as_an_option_and_records_it(monkeypatch):
    _fake_flash_qla(monkeypatch)
    backend = get_backend("flashqla")
    assert backend.operator == "recurrence" and backend.auto_cp is True
    spec = RecurrenceSpec(**CASE)
    off = type(backend)(auto_cp=False).prepare(spec, make_inputs(spec))
    assert off.info["auto_cp"] is False
    assert backend.supports(spec, "cpu") == "runs on cuda, not cpu"

"""FlashInfer's GDN and DSA backends on the CPU: their refusals in one line, and their argument preparation and
output conversion against a fake ``flashinfer`` that computes what the source documents (state stored (V, K),
gates as FlashInfer takes them, global -1-padded indices) with exact maths. A fake with the state not transposed,
the gates taken raw or the indices shifted by one must fail the same check."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from attnbench.backends.registry import get as get_backend
from attnbench.linear import flashinfer as lfi
from attnbench.linear.inputs import make_inputs
from attnbench.linear.reference import expand_heads, l2norm, reference
from attnbench.linear.spec import RecurrenceSpec
from attnbench.sparse import flashinfer as sfi
from attnbench.sparse.reference import Selection, reference_sparse
from attnbench.sparse.spec import SparseSpec
from attnbench.sparse.spec import make_inputs as sparse_inputs


def _recurrence(q, k, v, alpha, beta, scale, h0, l2):
    """One sequence, fp64: q, k (T, H, D), v (T, HV, D), alpha/beta (T, HV), h0 (HV, K, V) -> (o, S (HV, K, V))."""
    q, k, v = q.double(), k.double(), v.double()
    if l2:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[1] // q.shape[1]
    q, k = expand_heads(q, group), expand_heads(k, group)
    s = h0.double().clone()
    outs = []
    for t in range(q.shape[0]):
        s = alpha[t].double()[:, None, None] * s
        u = beta[t].double()[:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + k[t][:, :, None] * u[:, None, :]
        outs.append(scale * torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs), s


def _fake_flashinfer(monkeypatch, *, transpose_state=True, sigmoid_beta=True, index_shift=0):
    """A ``flashinfer`` with the three modules the backends import, each function with the real parameter list;
    returns the list the prefill appends its routing arguments to."""
    calls = []
    pkg = types.ModuleType("flashinfer")
    prefill, decode, dsa = (types.ModuleType(f"flashinfer.{n}") for n in
                            ("gdn_prefill", "gdn_decode", "dsa_sparse_attention"))

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                               state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
                               use_cp="auto", state_indices=None, _cp_chunk_len=None, backend="auto",
                               max_seqlen=None):
        assert cu_seqlens is not None and g is None or g.dtype == torch.float32
        assert use_cp in ("auto", True, False) and max_seqlen is not None
        calls.append(dict(use_cp=use_cp, max_seqlen=max_seqlen))
        hv, d = v.shape[1], q.shape[2]
        g = torch.ones(q.shape[0], hv) if g is None else g
        beta = torch.ones(q.shape[0], hv) if beta is None else beta
        outs, states = [], []
        cu = cu_seqlens.tolist()
        for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
            h0 = torch.zeros(hv, d, d) if initial_state is None else initial_state[n]
            h0 = h0.transpose(-1, -2) if transpose_state else h0  # stored (V, K)
            o, s = _recurrence(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], scale, h0, use_qk_l2norm_in_kernel)
            outs.append(o)
            states.append(s.transpose(-1, -2) if transpose_state else s)
        out = torch.cat(outs).to(q.dtype)
        return (out, torch.stack(states).float()) if output_final_state else out

    def gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None, use_qk_l2norm=True,
                                backend="auto"):
        assert state.shape == (q.shape[0], v.shape[2], q.shape[3], v.shape[3]) and state.dtype == torch.float32
        g = -torch.exp(A_log.double()) * F.softplus(a.double() + dt_bias.double(), beta=1.0, threshold=20.0)
        beta = torch.sigmoid(b.double()) if sigmoid_beta else b.double()
        outs = []
        for n in range(q.shape[0]):
            o, s = _recurrence(q[n], k[n], v[n], torch.exp(g[n]), beta[n], scale, state[n], use_qk_l2norm)
            state[n] = s.float()
            outs.append(o)
        return torch.stack(outs).to(torch.bfloat16), state

    def dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None, softmax_scale=None,
                             return_lse=False, key_passes=None, backend="cake", dkv_acc=None, dkv_dst_map=None):
        assert indices.dtype == torch.int32 and bool((indices >= -1).all())
        q = torch.cat([q_latent, q_rope], -1)
        kv = torch.cat([kv_latent, k_rope], -1)
        ref = reference_sparse(q, kv, Selection(indices=indices + index_shift, lengths=topk_length),
                               scale=softmax_scale)
        out = ref["out"].to(torch.bfloat16)
        return (out, ref["lse"].T.float()) if return_lse else out

    prefill.chunk_gated_delta_rule = chunk_gated_delta_rule
    decode.gated_delta_rule_decode = gated_delta_rule_decode
    dsa.dsa_sparse_attention = dsa_sparse_attention
    for name, mod in (("flashinfer", pkg), ("flashinfer.gdn_prefill", prefill), ("flashinfer.gdn_decode", decode),
                      ("flashinfer.dsa_sparse_attention", dsa)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def _close(got, want, tol=3e-2):
    return torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)


PREFILL = dict(kind="gdn", batch=2, seqlens=(5,), heads_qk=1, heads_v=2, d_k=128, initial_state=True)


@pytest.mark.parametrize("extra", [{}, {"seqlens": (3, 6)}, {"gated": False, "initial_state": False}])
def test_prefill_matches_reference_through_a_faithful_fake(monkeypatch, extra):
    _fake_flashinfer(monkeypatch)
    spec = RecurrenceSpec(**{**PREFILL, **extra})
    inputs = make_inputs(spec)
    got, want = lfi.prepare(spec, inputs, "prefill")(), reference(spec, inputs)
    assert got["out"].shape == want["out"].shape and got["final_state"].shape == want["final_state"].shape
    assert _close(got["out"], want["out"]) and _close(got["final_state"], want["final_state"])


@pytest.mark.parametrize("use_cp, passed", [("auto", "auto"), ("always", True), ("never", False)])
def test_prefill_passes_the_routing_and_the_longest_sequence(monkeypatch, use_cp, passed):
    calls = _fake_flashinfer(monkeypatch)
    spec = RecurrenceSpec(**{**PREFILL, "seqlens": (3, 6)})
    lfi.prepare(spec, make_inputs(spec), "prefill", use_cp=use_cp)()
    assert calls == [dict(use_cp=passed, max_seqlen=6)]


def test_prefill_check_fails_a_fake_whose_state_is_not_transposed(monkeypatch):
    _fake_flashinfer(monkeypatch, transpose_state=False)
    spec = RecurrenceSpec(**PREFILL)
    inputs = make_inputs(spec)
    got, want = lfi.prepare(spec, inputs, "prefill")(), reference(spec, inputs)
    assert not _close(got["final_state"], want["final_state"])


DECODE = dict(kind="gdn", batch=3, decode=True, heads_qk=1, heads_v=2, d_k=128)


@pytest.mark.parametrize("faithful", [True, False])
def test_decode_gates_and_state_against_a_fake(monkeypatch, faithful):
    _fake_flashinfer(monkeypatch, sigmoid_beta=faithful)
    spec = RecurrenceSpec(**DECODE)
    inputs = make_inputs(spec)
    run = lfi.prepare(spec, inputs, "decode")
    run()
    got, want = run(), reference(spec, inputs)  # a second call starts from the case's state again
    ok = _close(got["out"], want["out"]) and _close(got["final_state"], want["final_state"])
    assert ok == faithful


def test_decode_without_reset_starts_from_the_case_state_once(monkeypatch):
    _fake_flashinfer(monkeypatch)
    spec = RecurrenceSpec(**DECODE)
    inputs = make_inputs(spec)
    run, finish = lfi.prepare(spec, inputs, "decode", reset_state=False), lfi.finish("decode")
    want = reference(spec, inputs)
    first = finish(run())  # the checked call: from the case's state, in memory of its own
    assert _close(first["out"], want["out"]) and _close(first["final_state"], want["final_state"])
    second = run()  # runs on from the first call's state, in the same buffer
    assert not _close(second["final_state"], want["final_state"]) and _close(first["final_state"], want["final_state"])


def test_kernel_reason_names_what_did_not_import(monkeypatch):
    _fake_flashinfer(monkeypatch)  # no flashinfer.gdn_kernels in the fake
    why = lfi.kernel_reason("prefill", 9)
    assert why and "does not import" in why and "\n" not in why
    kernels = types.ModuleType("flashinfer.gdn_kernels")
    kernels.chunk_gated_delta_rule_sm90, kernels.cp_delta_rule_dsl_sm90 = len, None
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_kernels", kernels)
    why = lfi.kernel_reason("prefill", 9)
    assert "cp_delta_rule_dsl_sm90" in why and "chunk_gated_delta_rule_sm90" not in why and "\n" not in why
    kernels.cp_delta_rule_dsl_sm90 = len
    assert lfi.kernel_reason("prefill", 9) is None
    assert "run_nontranspose_decode" in lfi.kernel_reason("decode", 9)
    sys.modules["flashinfer.gdn_decode"].run_nontranspose_decode = len
    assert lfi.kernel_reason("decode", 9) is None


def test_backend_options_are_checked():
    from attnbench.backends import options
    assert options.resolve(["flashinfer-gdn.use_cp=never"]) == {"flashinfer-gdn": {"use_cp": "never"}}
    assert options.resolve(["flashinfer-gdn-decode.reset_state=false"]) == \
        {"flashinfer-gdn-decode": {"reset_state": False}}
    with pytest.raises(ValueError, match="always"):
        options.resolve(["flashinfer-gdn.use_cp=sometimes"])
    with pytest.raises(ValueError):
        options.resolve(["flashinfer-gdn-decode.use_cp=never"])


def test_decode_gates_invert_the_kernels_formula():
    g = -torch.tensor([1e-3, 0.5, 3.0, 25.0], dtype=torch.float64)
    beta = torch.tensor([0.1, 0.5, 0.9, 0.99], dtype=torch.float64)
    a, b = lfi.decode_gates(g, beta, torch.float64)
    assert torch.allclose(-F.softplus(a, threshold=20.0), g) and torch.allclose(torch.sigmoid(b), beta)


SPARSE = dict(batch=2, s_q=3, s_kv=40, heads=64, topk=16, indices="random")


@pytest.mark.parametrize("faithful", [True, False])
@pytest.mark.parametrize("lengths", [False, True])
def test_sparse_indices_and_lse_against_a_fake(monkeypatch, faithful, lengths):
    _fake_flashinfer(monkeypatch, index_shift=0 if faithful else 1)
    spec = SparseSpec(**SPARSE, topk_length=lengths)
    inputs = sparse_inputs(spec)
    got = sfi.prepare(spec, inputs)()
    want = reference_sparse(inputs.q, inputs.kv, inputs.selection, scale=spec.scale)
    assert got["lse"].shape == want["lse"].shape == (spec.heads, spec.queries)
    assert (_close(got["out"], want["out"]) and _close(got["lse"], want["lse"])) == faithful


@pytest.mark.parametrize("name, spec", [
    ("flashinfer-gdn", RecurrenceSpec(**PREFILL)),
    ("flashinfer-gdn-decode", RecurrenceSpec(**DECODE)),
    ("flashinfer-sparse-mla", SparseSpec(**SPARSE)),
])
def test_without_flashinfer_each_backend_says_why_in_one_line(monkeypatch, name, spec):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    why = get_backend(name).supports(spec, "cpu")
    assert why and "flashinfer" in why and "\n" not in why


@pytest.mark.parametrize("spec, op, words", [
    (RecurrenceSpec(**{**PREFILL, "kind": "kda"}), "prefill", "run gdn"),
    (RecurrenceSpec(**{**PREFILL, "pass_": "fwd_bwd"}), "prefill", "no backward"),
    (RecurrenceSpec(**{**PREFILL, "d_k": 64}), "prefill", "d_k = d_v = 128"),
    (RecurrenceSpec(**{**PREFILL, "dtype": "fp32"}), "prefill", "fp16 or bf16"),
    (RecurrenceSpec(**{**PREFILL, "chunk": 32}), "prefill", "chunks of 64"),
    (RecurrenceSpec(**DECODE), "prefill", "decode cases"),
    (RecurrenceSpec(**PREFILL), "decode", "--decode"),
    (RecurrenceSpec(**{**DECODE, "gated": False}), "decode", "no ungated"),
    (RecurrenceSpec(**{**DECODE, "d_k": 64}), "decode", ">= 128"),
    (RecurrenceSpec(**{**DECODE, "dtype": "fp16"}), "decode", "bf16 cases only"),
])
def test_gdn_refusals(spec, op, words):
    why = lfi.case_reason(spec, op)
    assert words in why and "\n" not in why


def test_arch_refusals_name_the_arch():
    assert lfi.arch_reason("prefill", (9, 0), "12.8") is None
    assert "sm80" in lfi.arch_reason("prefill", (8, 0), "12.8")
    assert "CUDA 13" in lfi.arch_reason("prefill", (10, 0), "12.8")
    assert lfi.arch_reason("prefill", (10, 0), "13.0") is None
    assert lfi.arch_reason("decode", (9, 0), "12.8") is None
    assert "sm100" in lfi.arch_reason("decode", (10, 0), "13.0")
    assert sfi.arch_reason((10, 0)) is None and sfi.arch_reason((10, 3)) is None
    assert "sm90" in sfi.arch_reason((9, 0))


@pytest.mark.parametrize("change, words", [
    ({"heads": 128}, "64 query heads"), ({"dtype": "fp16"}, "bf16"), ({"sink": True}, "sink"),
    ({"decode": True}, "FP8"), ({"extra": (8, 4)}, "extra cache"),
])
def test_sparse_refusals(change, words):
    why = sfi.case_reason(SparseSpec(**{**SPARSE, **change}))
    assert words in why and "\n" not in why

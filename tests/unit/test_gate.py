"""Gated attention (Qwen3-Next): the exact reference against the definition written out, the check failing
kernels that get the gate or its gradient wrong in bf16, and the feature reaching every layer through its one
declaration (flags, YAML, preset, labels, exports, ``backends``)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbench import features
from attnbench.accuracy.check import AccuracyChecker
from attnbench.accuracy.reference import BlockSizes, reference_attention
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared, autograd_closure
from attnbench.backends.naive import NaiveBackend, naive_attention
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

SRC = Path(__file__).resolve().parents[2] / "src" / "attnbench"


def written_out(spec, q, k, v, gate):
    """sigmoid(G) ⊙ softmax(scale · q kᵀ + causal mask) v, dense fp64, differentiable; GQA by repeating K/V."""
    groups = q.shape[2] // k.shape[2]
    kh, vh = (t.repeat_interleave(groups, 2) for t in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, kh) * spec.softmax_scale
    if spec.causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), vh)
    return out * torch.sigmoid(gate), torch.logsumexp(s, -1)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_written_out_gate_forward_and_backward(causal):
    spec = AttnSpec(batch=2, seqlens_q=(13,), seqlens_k=(21,), heads_q=6, heads_kv=2, head_dim=8, head_dim_v=5,
                    dtype="fp64", causal=causal, gate=True, pass_="fwd_bwd")
    inputs = make_inputs(spec, seed=5)
    assert inputs.gate.shape == inputs.dout.shape  # one gate value per output element
    ref = reference_attention(spec, inputs, blocks=BlockSizes(q=4, k=5))
    q, k, v, g = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v, inputs.gate))
    out, lse = written_out(spec, q, k, v, g)
    torch.testing.assert_close(ref.out, out.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse.detach(), rtol=0, atol=1e-12)  # attention's own LSE
    grads = torch.autograd.grad(out, (q, k, v, g), inputs.dout)
    for name, want in zip(("dq", "dk", "dv", "dgate"), grads, strict=True):
        torch.testing.assert_close(ref[name], want, rtol=0, atol=1e-12, msg=name)


def test_varlen_gate_is_sliced_with_the_query_rows():
    spec = AttnSpec(seqlens_q=(5, 9), seqlens_k=(7, 9), heads_q=2, head_dim=8, dtype="fp64", causal=True, gate=True,
                    pass_="fwd_bwd")
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs)
    for (a, b), (c, d) in (((0, 5), (0, 7)), ((5, 14), (7, 16))):
        part = spec.replace(seqlens_q=(b - a,), seqlens_k=(d - c,))
        q, k, v, g = (t.detach().clone().requires_grad_(True) for t in (
            inputs.q[None, a:b], inputs.k[None, c:d], inputs.v[None, c:d], inputs.gate[None, a:b]))
        out, _ = written_out(part, q, k, v, g)
        torch.testing.assert_close(ref.out[a:b], out[0].detach(), rtol=0, atol=1e-12)
        dg = torch.autograd.grad(out, g, inputs.dout[None, a:b])[0]
        torch.testing.assert_close(ref.dgate[a:b], dg[0], rtol=0, atol=1e-12)


def test_cases_without_a_gate_keep_their_inputs():
    spec = AttnSpec(seqlens_q=(33,), heads_q=4, head_dim=16, dtype="bf16", sinks=True)
    plain, gated = make_inputs(spec), make_inputs(spec.replace(gate=True))
    for name in ("q", "k", "v", "dout", "sinks"):
        assert torch.equal(getattr(plain, name), getattr(gated, name)), name
    assert plain.gate is None and gated.gate is not None


# ---- the check catches each mistake a kernel could make with the gate ------------------------------
class _Ungrad(torch.autograd.Function):
    """sigmoid(G) ⊙ o whose backward gives dG with the sigmoid's derivative dropped (σ instead of σ(1 − σ))."""

    @staticmethod
    def forward(ctx, out, gate):
        ctx.save_for_backward(out, gate)
        return out * torch.sigmoid(gate)

    @staticmethod
    def backward(ctx, dout):
        out, gate = ctx.saved_tensors
        s = torch.sigmoid(gate)
        return dout * s, dout * out * s


class GateMistaken(Backend):
    """naive attention whose gate (applied inside its own forward) is done wrong in one way."""

    capabilities = Capabilities(gate=True)

    def __init__(self, mistake: str):
        self.name, self.mistake = f"gate-{mistake}", mistake

    def prepare(self, spec, inputs):
        m = self.mistake

        def forward(q, k, v, gate):
            out = naive_attention(q, k, v, causal=spec.causal, window=None, scale=spec.softmax_scale)
            if m == "ignored":  # the gate reaches the kernel, which never applies it (dG = 0)
                return out + 0 * gate.sum().to(out.dtype)
            if m == "no-sigmoid":
                return out * gate
            if m == "wrong-dgate":
                return _Ungrad.apply(out, gate)
            if m == "fused-scaled":  # a fused gate, marked by a factor the test can see
                return out * torch.sigmoid(gate) * 1.0001
            raise AssertionError(m)
        fn = autograd_closure(spec, inputs, forward, fused_outputs=frozenset({"gate"}))
        if m == "dgate-missing":
            fn = autograd_closure(spec, inputs, lambda q, k, v: naive_attention(
                q, k, v, causal=spec.causal, window=None, scale=spec.softmax_scale))

            def no_dgate():
                got = fn()
                return Outputs(out=got.out, dq=got.dq, dk=got.dk, dv=got.dv)
            return Prepared(fn=no_dgate)
        return Prepared(fn=fn)


@pytest.mark.parametrize("mistake", ["ignored", "no-sigmoid", "wrong-dgate", "dgate-missing"])
def test_the_check_fails_a_kernel_that_gets_the_gate_wrong_in_bf16(mistake):
    spec = AttnSpec(batch=2, seqlens_q=(96,), heads_q=4, heads_kv=2, head_dim=32, dtype="bf16", causal=True,
                    gate=True, pass_="fwd_bwd")
    inputs = make_inputs(spec)
    checker = AccuracyChecker()
    right = checker(spec, inputs, NaiveBackend().prepare(spec, inputs).fn(), NaiveBackend())
    assert right["verdict"] == "pass", right.get("reason")
    assert "dgate" in right["tensors"]
    wrong = checker(spec, inputs, GateMistaken(mistake).prepare(spec, inputs).fn(), GateMistaken(mistake))
    assert wrong["verdict"] == "fail", wrong["tensors"]
    if mistake == "dgate-missing":
        assert "dgate: not returned" in wrong["reason"]


def test_a_kernel_that_fuses_the_gate_gets_it_once():
    """``fused_outputs``: the closure leaves the gate to the kernel and does not apply it a second time."""
    spec = AttnSpec(seqlens_q=(40,), heads_q=2, head_dim=16, dtype="fp32", gate=True, pass_="fwd_bwd")
    inputs = make_inputs(spec)
    fused = GateMistaken("fused-scaled").prepare(spec, inputs).fn()
    plain = NaiveBackend().prepare(spec, inputs).fn()
    torch.testing.assert_close(fused.out, plain.out * 1.0001, rtol=1e-5, atol=1e-6)


# ---- one declaration reaches every layer ------------------------------------------------------------
def test_each_feature_is_named_in_at_most_four_modules_outside_backends_and_models():
    for feature in features.FEATURES:
        found = subprocess.run(["grep", "-rlw", "--include=*.py", feature.name, str(SRC)], capture_output=True,
                               text=True).stdout.split()
        outside = sorted(str(Path(p).relative_to(SRC)) for p in found
                         if Path(p).relative_to(SRC).parts[0] not in ("backends", "models"))
        assert len(outside) <= 4, (feature.name, outside)


def test_a_backend_without_the_capability_records_the_features_refusal():
    from attnbench.backends.base import check_capabilities
    spec = AttnSpec(seqlens_q=(16,), heads_q=2, head_dim=8, gate=True)
    assert check_capabilities(Capabilities(), spec, "cpu") == "output gate not supported"
    assert check_capabilities(Capabilities(gate=True), spec, "cpu") is None


def test_outputs_are_named_tensors():
    o = Outputs(out=torch.ones(2), dq=None)
    assert "out" in o and "dq" not in o and o.dq is None and o.lse is None
    o["dgate"] = torch.zeros(2)
    assert sorted(o.tensors()) == ["dgate", "out"]


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_gate_flag_preset_label_and_export(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "r.json"
    done = _cli("run", "--device", "cpu", "--preset", "qwen3-next-80b", "--seq-lens", "24", "--head-size", "16",
                "--q-heads", "4", "--pass", "fwd_bwd", "--backends", "naive,sdpa-math", "--db", str(db),
                "--output", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert {r["backend"] for r in rows} == {"naive", "sdpa-math"}
    assert all(r["gate"] is True and r["verdict"] == "pass" and "gate" in r["label"] for r in rows)
    assert all("dgate" in r["accuracy"]["tensors"] for r in rows)
    both = _cli("run", "--device", "cpu", "--gate", "both", "--seq-lens", "16", "--q-heads", "2", "--head-size", "8",
                "--pass", "fwd", "--backends", "naive", "--db", str(db), "--quiet", cwd=tmp_path)
    assert both.returncode == 0, both.stderr
    listed = _cli("presets", cwd=tmp_path)
    assert "qwen3-next-80b" in listed.stdout and "16/2 heads, d256, gate" in listed.stdout

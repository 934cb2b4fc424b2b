"""Sinks, logit softcap and ALiBi: the exact reference against the definitions written out element by element,
and the check failing kernels that get a variant wrong (each mistake a kernel could make, as a backend)."""

import math

import pytest
import torch

from attnbench.accuracy.check import AccuracyChecker
from attnbench.accuracy.reference import BlockSizes, reference_attention
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared, autograd_closure
from attnbench.backends.naive import NaiveBackend, naive_attention
from attnbench.features.alibi import alibi_label, alibi_slopes
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec


def written_out(spec: AttnSpec, q, k, v, sinks):
    """out (B, Sq, Hq, Dv) and lse (B, Hq, Sq), one row at a time from the definitions (fp64, differentiable)."""
    bsz, sq, hq, _ = q.shape
    sk, groups = k.shape[1], hq // k.shape[2]
    left, right = spec.window if spec.window is not None else (-1, -1)
    outs, lses = [], []
    for b in range(bsz):
        for h in range(hq):
            for i in range(sq):
                ia = i + sk - sq  # the query's position aligned to the lower right
                scores, keys = [], []
                for j in range(sk):
                    if (spec.causal and j > ia) or (left >= 0 and j < ia - left) or (right >= 0 and j > ia + right):
                        continue
                    s = (q[b, i, h] @ k[b, j, h // groups]) * spec.softmax_scale
                    if spec.softcap is not None:
                        s = spec.softcap * torch.tanh(s / spec.softcap)
                    if spec.alibi is not None:
                        s = s - spec.alibi[h] * (ia - j)
                    scores.append(s)
                    keys.append(j)
                if sinks is not None:
                    scores.append(sinks[h])
                if not scores:  # no key and no sink: out 0, lse -inf
                    outs.append(torch.zeros(v.shape[-1], dtype=q.dtype))
                    lses.append(torch.tensor(-math.inf, dtype=q.dtype))
                    continue
                row = torch.stack(scores)
                lse = torch.logsumexp(row, 0)
                p = torch.exp(row - lse)
                outs.append(sum((p[n] * v[b, j, h // groups] for n, j in enumerate(keys)),
                                torch.zeros(v.shape[-1], dtype=q.dtype)))
                lses.append(lse)
    out = torch.stack(outs).view(bsz, hq, sq, -1).transpose(1, 2)
    return out, torch.stack(lses).view(bsz, hq, sq)


CASES = {
    "sinks, softcap and ALiBi, causal, GQA, fewer queries": dict(
        seqlens_q=(13,), seqlens_k=(21,), heads_q=6, heads_kv=2, causal=True, sinks=True, softcap=3.0,
        alibi=alibi_slopes(6)),
    "sinks without a mask": dict(seqlens_q=(17,), heads_q=3, sinks=True),
    "softcap and signed ALiBi both ways of a window, rows with no key": dict(
        seqlens_q=(17,), seqlens_k=(9,), heads_q=4, heads_kv=2, window=(3, 2), softcap=1.5, alibi=(0.3, -0.2, 0.5, 1.0)),
    "sinks carry rows with no key": dict(
        seqlens_q=(17,), seqlens_k=(9,), heads_q=4, heads_kv=2, causal=True, sinks=True, alibi=(0.3, -0.2, 0.5, 1.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reference_is_the_written_out_definition_forward_and_backward(case):
    spec = AttnSpec(batch=2, head_dim=8, dtype="fp64", pass_="fwd_bwd", **CASES[case])
    inputs = make_inputs(spec, seed=3)
    ref = reference_attention(spec, inputs, blocks=BlockSizes(q=4, k=5))  # several blocks each way
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    sinks = inputs.sinks.double().requires_grad_(True) if spec.sinks else None
    out, lse = written_out(spec, q, k, v, sinks)
    torch.testing.assert_close(ref.out, out.detach(), rtol=0, atol=1e-12)
    finite = torch.isfinite(lse)
    assert torch.equal(finite, torch.isfinite(ref.lse))
    torch.testing.assert_close(ref.lse[finite], lse.detach()[finite], rtol=0, atol=1e-12)
    wrt = (q, k, v) + ((sinks,) if sinks is not None else ())
    grads = torch.autograd.grad(out, wrt, inputs.dout)
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (ref.dq, ref.dk, ref.dv, ref.dsinks), grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)
    assert (ref.dsinks is None) == (not spec.sinks)


def test_varlen_sums_the_sink_gradient_over_sequences():
    spec = AttnSpec(seqlens_q=(5, 9), seqlens_k=(7, 9), heads_q=2, head_dim=8, dtype="fp64", causal=True, sinks=True,
                    pass_="fwd_bwd")
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs)
    total = torch.zeros(2, dtype=torch.float64)
    for (a, b), (c, d) in (((0, 5), (0, 7)), ((5, 14), (7, 16))):
        part = AttnSpec(seqlens_q=(b - a,), seqlens_k=(d - c,), heads_q=2, head_dim=8, dtype="fp64", causal=True,
                        sinks=True, pass_="fwd_bwd")
        sinks = inputs.sinks.double().requires_grad_(True)
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q[None, a:b], inputs.k[None, c:d],
                                                                     inputs.v[None, c:d]))
        out, _ = written_out(part, q, k, v, sinks)
        total += torch.autograd.grad(out, sinks, inputs.dout[None, a:b])[0]
    torch.testing.assert_close(ref.dsinks, total, rtol=0, atol=1e-12)


def test_standard_alibi_slopes_are_the_papers_geometric_series():
    assert alibi_slopes(8) == tuple(2.0 ** -k for k in range(1, 9))
    # 12 heads: the 8-head series, then every other slope of the 16-head series (2^-0.5, 2^-1.5, ...)
    assert alibi_slopes(12)[8:] == pytest.approx([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5])
    assert alibi_label(alibi_slopes(112)) == "alibi" and alibi_label((0.1, 0.2)).startswith("alibi:")


def test_softcap_inputs_reach_the_caps_knee_and_leave_other_cases_alone():
    spec = AttnSpec(seqlens_q=(256,), heads_q=4, head_dim=64, dtype="fp32", softcap=30.0)
    inputs = make_inputs(spec)
    scores = torch.einsum("bihd,bjhd->bhij", inputs.q, inputs.k) * spec.softmax_scale
    share = (scores.abs() >= 15.0).double().mean().item()
    assert 0.03 < share < 0.08  # about 5% past c/2 (a standard deviation of c/4)
    plain = make_inputs(spec.replace(softcap=None))
    assert torch.equal(plain.q, make_inputs(AttnSpec(seqlens_q=(256,), heads_q=4, head_dim=64, dtype="fp32")).q)
    assert not torch.equal(plain.q, inputs.q) and torch.equal(plain.v, inputs.v)


@pytest.mark.parametrize("sq", [100, 577])
def test_alibi_moves_the_top_key_of_most_rows(sq):
    spec = AttnSpec(seqlens_q=(sq,), heads_q=4, head_dim=64, dtype="fp32", alibi=alibi_slopes(4))
    inputs = make_inputs(spec)
    scores = torch.einsum("bihd,bjhd->bhij", inputs.q, inputs.k) * spec.softmax_scale
    from attnbench.features.alibi import relative_positions
    biased = scores + torch.tensor(spec.alibi).view(1, -1, 1, 1) * relative_positions(sq, sq, "cpu")
    moved = (scores.argmax(-1) != biased.argmax(-1)).double().mean(dim=(0, 2))
    assert moved.min() > 0.1 and moved.max() > 0.85


def test_sinks_carry_weight_so_ignoring_them_is_no_rounding_error():
    spec = AttnSpec(seqlens_q=(256,), heads_q=8, head_dim=64, dtype="fp32", sinks=True)
    inputs = make_inputs(spec)
    with_sinks = reference_attention(spec, inputs, grads=False)
    without = reference_attention(spec.replace(sinks=False), inputs, grads=False)
    share = 1 - torch.exp(without.lse - with_sinks.lse)  # each row's weight on its sink
    assert 0.05 < share.min() and share.max() < 0.99 and 0.2 < share.mean() < 0.8


# ---- the check catches each mistake a kernel could make --------------------------------------------
class Mistaken(Backend):
    """naive attention with one variant done wrong (``mistake``), declaring every variant."""

    capabilities = Capabilities(sinks=True, softcap=True, alibi=True, window=True)

    def __init__(self, mistake: str):
        self.name, self.mistake = f"mistaken-{mistake}", mistake

    def prepare(self, spec, inputs):
        m = self.mistake
        wrong = spec
        if m == "softcap-before-scale":  # c·tanh(q·k / c)·scale: the cap applied to unscaled scores
            wrong = spec.replace(softcap=spec.softcap / spec.softmax_scale)
        if m == "alibi-reversed-heads":
            wrong = spec.replace(alibi=tuple(reversed(spec.alibi)))
        if m == "alibi-symmetric":  # -slope·|i'-j|, as flash-attn 2 defines it
            wrong = spec

        def forward(q, k, v, sinks=None):
            if m == "softcap-derivative-dropped":  # the forward's cap, a backward as if there were none
                groups = q.shape[2] // k.shape[2]
                scores = torch.einsum("bihd,bjhd->bhij", q * spec.softmax_scale, k.repeat_interleave(groups, 2))
                scores = _StraightThrough.apply(scores, spec.softcap)
                mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(
                    scores.shape[-1] - scores.shape[-2])
                scores = scores.masked_fill(~mask, -math.inf) if spec.causal else scores
                return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v.repeat_interleave(groups, 2))
            if m == "alibi-backward-missing":  # the forward with the bias, the gradients as if there were none
                right = naive_attention(q, k, v, causal=spec.causal, window=spec.window, scale=spec.softmax_scale,
                                        terms=_terms(spec, q))
                plain = naive_attention(q, k, v, causal=spec.causal, window=spec.window, scale=spec.softmax_scale)
                return right.detach() + (plain - plain.detach())
            if m == "sinks-ignored":  # the sinks reach the kernel, which never reads them (d(sinks) = 0)
                out = naive_attention(q, k, v, causal=spec.causal, window=spec.window, scale=spec.softmax_scale)
                return out + 0 * sinks.sum().to(out.dtype)
            if m == "sink-in-numerator":  # the sink taken as a key whose value is the first token's
                groups = q.shape[2] // k.shape[2]
                k1 = torch.cat([k[:, :1] * 0, k], dim=1)
                v1 = torch.cat([v[:, :1], v], dim=1)
                bias = torch.zeros(q.shape[2], q.shape[1], k1.shape[1], dtype=q.dtype, device=q.device)
                bias[:, :, 0] = sinks.view(-1, 1).to(q.dtype)
                scores = torch.einsum("bihd,bjhd->bhij", q * spec.softmax_scale, k1.repeat_interleave(groups, 2)) + bias
                return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v1.repeat_interleave(groups, 2))
            if m == "alibi-symmetric":
                return _symmetric_alibi(spec, q, k, v)
            if m == "softcap-before-scale":
                scores = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(q.shape[2] // k.shape[2], 2))
                scores = spec.softcap * torch.tanh(scores / spec.softcap) * spec.softmax_scale
                mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(
                    scores.shape[-1] - scores.shape[-2])
                scores = scores.masked_fill(~mask, -math.inf) if spec.causal else scores
                return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v.repeat_interleave(q.shape[2] // k.shape[2], 2))
            return naive_attention(q, k, v, causal=wrong.causal, window=wrong.window, scale=wrong.softmax_scale,
                                   terms=_terms(wrong, q), sinks=sinks)
        fn = autograd_closure(spec, inputs, forward)
        if m == "dsinks-missing":
            def no_dsinks():
                got = fn()
                return Outputs(out=got.out, dq=got.dq, dk=got.dk, dv=got.dv)
            return Prepared(fn=no_dsinks)
        return Prepared(fn=fn)


class _StraightThrough(torch.autograd.Function):
    """c·tanh(s/c) forward, the identity's gradient backward: the softcap's derivative 1 − tanh² dropped."""

    @staticmethod
    def forward(ctx, s, cap):
        return cap * torch.tanh(s / cap)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _terms(spec, q):
    from attnbench.backends.naive import Terms
    return Terms.build(spec, q.shape[1], q.shape[1], q.device)


def _symmetric_alibi(spec, q, k, v):
    groups = q.shape[2] // k.shape[2]
    scores = torch.einsum("bihd,bjhd->bhij", q * spec.softmax_scale, k.repeat_interleave(groups, 2))
    i = torch.arange(q.shape[1], device=q.device).view(-1, 1)
    j = torch.arange(k.shape[1], device=q.device).view(1, -1)
    slopes = torch.tensor(spec.alibi, dtype=q.dtype, device=q.device).view(-1, 1, 1)
    scores = scores - slopes * (i - j).abs().to(q.dtype)
    return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v.repeat_interleave(groups, 2))


MISTAKES = {
    "sinks-ignored": dict(sinks=True, causal=True),
    "sink-in-numerator": dict(sinks=True),
    "softcap-before-scale": dict(softcap=2.0, causal=True),
    "softcap-derivative-dropped": dict(softcap=30.0, causal=True),
    "softcap-derivative-dropped at Gemma 2's cap": dict(softcap=50.0),
    "alibi-reversed-heads": dict(alibi=alibi_slopes(4), causal=True),
    "alibi-symmetric": dict(alibi=alibi_slopes(4)),
    "alibi-backward-missing": dict(alibi=alibi_slopes(4), causal=True),
    "dsinks-missing": dict(sinks=True, causal=True),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_check_fails_a_kernel_that_gets_a_variant_wrong(mistake, dtype):
    spec = AttnSpec(batch=2, seqlens_q=(96,), heads_q=4, heads_kv=2, head_dim=32, dtype=dtype, pass_="fwd_bwd",
                    **MISTAKES[mistake])
    inputs = make_inputs(spec)
    checker = AccuracyChecker()
    right = checker(spec, inputs, NaiveBackend().prepare(spec, inputs).fn(), NaiveBackend())
    assert right["verdict"] == "pass", right.get("reason")
    kind = mistake.partition(" ")[0]
    wrong = checker(spec, inputs, Mistaken(kind).prepare(spec, inputs).fn(), Mistaken(kind))
    assert wrong["verdict"] == "fail"
    if mistake == "dsinks-missing":
        assert "dsinks: not returned" in wrong["reason"]

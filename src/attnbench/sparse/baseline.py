"""Index-selected MLA in PyTorch as a careful kernel computes it in the input dtype: the yardstick of the check.

The yardstick of ``accuracy/baseline.py`` for this operator must not be more biased than a good kernel, or its own
error loosens the limit a kernel is held to. So it computes as FlashMLA's kernels do: each query's rows gathered,
scores ``q · rowsᵀ`` with fp32 accumulators (the products of two bf16 numbers are exact in fp32), the empty slots
−inf, the logsumexp and softmax in fp32, the probabilities rounded to the dtype for ``probabilities · values`` (as
a kernel feeds them to its tensor cores), that product accumulated in fp32, times a sink's complement
``σ(lse − sink)`` in fp32 with the sink logit as given (fp32: rounding it to bf16 moves every output of its head by
up to 0.7%), and the output rounded to the dtype once; the LSE stays fp32, as kernels return it. The gradients
through autograd. Queries go a block at a time (``rows`` of them), each block's cache gradients summed in fp32 and
rounded to the dtype once at the end. Semantics are ``reference.py``'s: lse (Hq, T) without the sink, −inf (and out
0) for a query with no valid slot.
"""

from __future__ import annotations

import math

import torch

from attnbench.outputs import Outputs
from attnbench.sparse.reference import Selection, caches


def _block(q_blk, sources, attn_sink, a: int, b: int, scale: float, d_v: int):
    """(out (b-a, Hq, d_v) in q's dtype, lse (b-a, Hq) fp32) of queries [a, b) (``q_blk``), differentiable."""
    rows, valid = [], []
    for src in sources:
        ok = src.selection.valid(src.rows.shape[0], a, b)
        idx = src.selection.indices[a:b].long().clamp(0, src.rows.shape[0] - 1)
        rows.append(torch.where(ok[..., None], src.rows[idx], 0.0))  # not a product: an unused row may be NaN
        valid.append(ok)
    g, ok = torch.cat(rows, dim=1), torch.cat(valid, dim=1)
    acc = torch.promote_types(q_blk.dtype, torch.float32)  # the accumulators
    s = torch.matmul(q_blk.to(acc), g.to(acc).transpose(1, 2)) * scale
    s = s.masked_fill(~ok[:, None, :], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    alone = torch.isneginf(lse)[..., None]  # no valid slot: softmax over zeros, output 0 (never NaN)
    p = torch.softmax(s.masked_fill(alone, 0.0), dim=-1).masked_fill(alone, 0.0)
    out = torch.matmul(p.to(q_blk.dtype).to(acc), g[..., :d_v].to(acc))
    if attn_sink is not None:  # the sink's share of the denominator: exp(lse) / (exp(lse) + exp(sink)), ±inf included
        out = out * torch.sigmoid(lse.masked_fill(alone[..., 0], 0.0) - attn_sink.to(acc))[..., None]
    return out.to(q_blk.dtype), lse


def baseline_sparse(q: torch.Tensor, kv: torch.Tensor, selection: Selection, *, scale: float, d_v: int = 512,
                    attn_sink: torch.Tensor | None = None, extra_kv: torch.Tensor | None = None,
                    extra: Selection | None = None, dout: torch.Tensor | None = None, rows: int = 256) -> Outputs:
    """Outputs in the reference's layout computed in q's dtype (arguments as ``reference.reference_sparse``)."""
    grads = dout is not None
    leaves = {name: t.detach().requires_grad_(grads) for name, t in
              (("kv", kv), ("extra_kv", extra_kv), ("attn_sink", attn_sink)) if t is not None}
    sources = caches(q, leaves["kv"], selection, leaves.get("extra_kv"), extra)
    sums = {name: torch.zeros(t.shape, dtype=torch.float64 if t.dtype == torch.float64 else torch.float32,
                              device=t.device) for name, t in leaves.items()}
    outs, lses, dqs = [], [], []
    for a in range(0, q.shape[0], rows):
        b = min(q.shape[0], a + rows)
        q_blk = q[a:b].detach().requires_grad_(grads)
        with torch.set_grad_enabled(grads):
            out, lse = _block(q_blk, sources, leaves.get("attn_sink"), a, b, scale, d_v)
        outs.append(out.detach())
        lses.append(lse.detach())
        if grads:
            names = list(leaves)
            got = torch.autograd.grad(out, [q_blk] + [leaves[n] for n in names], dout[a:b].to(out.dtype),
                                      allow_unused=True)
            dqs.append(got[0])
            for name, grad in zip(names, got[1:]):
                if grad is not None:
                    sums[name] += grad
    result = Outputs(out=torch.cat(outs), lse=torch.cat(lses).T)
    if grads:
        result.dq = torch.cat(dqs)
        for name, total in sums.items():
            result["d" + name] = total.to(leaves[name].dtype)
    return result

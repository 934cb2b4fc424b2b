"""The yardstick of the verdict: plain PyTorch math (matmul, softmax, matmul) in the case's own dtype.

This is what the ``naive`` backend computes — scores, softmax and probabilities all held in the
input dtype, gradients through autograd — so its error against the exact reference is the error a
user gets from writing attention by hand in that dtype. To keep memory bounded on long sequences
the query rows are processed in blocks (each block sees every key); dQ of a block is exact for that
block, and the dK/dV contributions of the blocks are summed in fp32 (fp64 for fp64) and rounded to the dtype once at
the end. With a single block (short sequences) the result is the naive backend's, bit for bit. The variants
(softcap, ALiBi, sinks) are applied as the naive backend applies them; the sinks enter the scores in the dtype,
as a model's parameter of that dtype does, and their gradient (of the fp32 input) is summed over blocks in fp32.
"""

from __future__ import annotations

import dataclasses

import torch

from attnbench.accuracy.reference import block_keep, mask_bounds
from attnbench.backends.base import expand_kv_heads
from attnbench.backends.naive import Terms
from attnbench.inputs import AttnInputs
from attnbench.masks import keep_mask
from attnbench.spec import AttnSpec
from attnbench.variants import modify_scores, with_sinks

MAX_SCORE_ELEMS = 2 ** 27
"""Cap on one (B, Hq, rows, Sk) score block; autograd keeps about four such tensors alive."""


def _math_rows(q_blk, k, v, keep, scale: float, terms=None, sinks=None):
    """naive attention of query rows ``q_blk`` (B, rows, Hq, D) against all keys; returns (out bshd, lse bhs)."""
    groups = q_blk.shape[2] // k.shape[2]
    qh = q_blk.transpose(1, 2)
    kh = expand_kv_heads(k, groups).transpose(1, 2)
    vh = expand_kv_heads(v, groups).transpose(1, 2)
    scores = torch.matmul(qh, kh.transpose(-2, -1)) * scale
    if terms is not None:
        scores = modify_scores(scores, cap=terms.softcap, slope=terms.slopes, rel=terms.rel)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is not None:  # the sink is one more column of every row, dropped after the softmax
        scores = with_sinks(scores, sinks)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    elif keep is not None and not bool(keep.any(dim=1).all()):
        probs = probs.masked_fill(~keep.any(dim=1, keepdim=True), 0.0)  # rows with no key: 0, not NaN
    return torch.matmul(probs, vh).transpose(1, 2), lse


def _dense(spec: AttnSpec, q, k, v, dout, grads: bool, max_elems: int, sinks=None) -> dict[str, torch.Tensor]:
    bsz, sq, hq, _ = q.shape
    sk = k.shape[1]
    left, right = mask_bounds(spec.causal, spec.window)
    rows = max(1, min(sq, max_elems // max(1, bsz * hq * sk)))
    outs, lses, dqs = [], [], []
    k_leaf, v_leaf = k.detach().requires_grad_(grads), v.detach().requires_grad_(grads)
    sink_leaf = None if sinks is None else sinks.detach().requires_grad_(grads)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dk = torch.zeros(k.shape, dtype=acc, device=k.device) if grads else None
    dv = torch.zeros(v.shape, dtype=acc, device=v.device) if grads else None
    dsinks = None if sinks is None or not grads else torch.zeros(sinks.shape, dtype=acc, device=q.device)
    tile_keep = None if spec.sta is None else spec.sta.tile_keep(hq, q.device)
    terms = Terms.build(spec, sq, sk, q.device)
    for a in range(0, sq, rows):
        b = min(sq, a + rows)
        keep = block_keep(a, b, 0, sk, sq, sk, left, right, q.device)
        if spec.tree is not None:
            keep = keep_mask(sq, sk, True, device=q.device, tree=spec.tree)[a:b]
        if spec.sta is not None:  # (Hq, rows, keys): each head its own window
            keep = spec.sta.block(a, b, 0, sk, hq, q.device, tile_keep=tile_keep)
        q_leaf = q[:, a:b].detach().requires_grad_(grads)
        block_terms = None if terms is None else dataclasses.replace(
            terms, rel=None if terms.rel is None else terms.rel[a:b])
        with torch.set_grad_enabled(grads):
            # the sinks in the case's dtype, as a model holding them as a parameter of that dtype has them
            block_sinks = None if sink_leaf is None else sink_leaf.to(q.dtype)
            out, lse = _math_rows(q_leaf, k_leaf, v_leaf, keep, spec.softmax_scale, block_terms, block_sinks)
        if grads:
            wrt = (q_leaf, k_leaf, v_leaf) + (() if sink_leaf is None else (sink_leaf,))
            dq_blk, dk_blk, dv_blk, *d_sinks = torch.autograd.grad(out, wrt, dout[:, a:b])
            dqs.append(dq_blk)
            dk += dk_blk
            dv += dv_blk
            if d_sinks:
                dsinks += d_sinks[0]
        outs.append(out.detach())
        lses.append(lse.detach())
    result = {"out": torch.cat(outs, dim=1), "lse": torch.cat(lses, dim=2)}
    if grads:
        result.update(dq=torch.cat(dqs, dim=1), dk=dk.to(k.dtype), dv=dv.to(v.dtype))
        if dsinks is not None:  # the float32 leaf's gradient: a sum over rows, accumulated in fp32
            result["dsinks"] = dsinks
    return result


def math_baseline(spec: AttnSpec, inputs: AttnInputs, *, grads: bool = True,
                  max_elems: int = MAX_SCORE_ELEMS) -> dict[str, torch.Tensor]:
    """out, lse (and dq, dk, dv) of plain math in ``spec.dtype``, shaped like the reference's."""
    sinks = inputs.sinks if spec.sinks else None
    if not inputs.varlen:
        return _dense(spec, inputs.q, inputs.k, inputs.v, inputs.dout, grads, max_elems, sinks)
    parts = []
    for (a, b), (c, d) in inputs.bounds():
        k, v = inputs.request_kv(c, d)  # a shared prefix in front of the request's own keys
        parts.append(_dense(spec, inputs.q[None, a:b], k[None], v[None], inputs.dout[None, a:b], grads, max_elems,
                            sinks))
    result = {"out": torch.cat([p["out"][0] for p in parts]), "lse": torch.cat([p["lse"][0] for p in parts], dim=1)}
    if grads:
        for name in ("dq", "dk", "dv"):
            result[name] = torch.cat([p[name][0] for p in parts])
        if sinks is not None:  # one sink per head for every sequence: the gradients add up
            result["dsinks"] = torch.stack([p["dsinks"] for p in parts]).sum(0)
    return result

"""The yardstick of the verdict: plain PyTorch math (matmul, softmax, matmul) in the case's own dtype.

This is what the ``naive`` backend computes — scores, softmax and probabilities all held in the
input dtype, gradients through autograd — so its error against the exact reference is the error a
user gets from writing attention by hand in that dtype. To keep memory bounded on long sequences
the query rows are processed in blocks (each block sees every key); dQ of a block is exact for that
block, and the dK/dV contributions of the blocks are summed in fp32 (fp64 for fp64) and rounded to the dtype once at
the end. With a single block (short sequences) the result is the naive backend's, bit for bit. K/V heads shared
by several query heads are copied per query head, as the naive backend does, unless the copies would pass
``EXPAND_MAX_BYTES`` (then dK/dV are summed over the group in fp32). The features of
the case (``attnbench.features``) are applied in their plain forms, as the naive backend applies them; a per-head
input (a row feature's logits) enters the scores in the dtype, as a model's parameter of that dtype does, and its
gradient (of the fp32 input) is summed over blocks in fp32.
"""

from __future__ import annotations

import torch

from attnbench import features
from attnbench.accuracy.reference import block_keep, mask_bounds
from attnbench.backends.base import expand_kv_heads
from attnbench.inputs import AttnInputs
from attnbench.masks import keep_mask
from attnbench.outputs import grad_name
from attnbench.spec import AttnSpec

MAX_SCORE_ELEMS = 2 ** 27
"""Cap on one (B, Hq, rows, Sk) score block; autograd keeps about four such tensors alive."""
EXPAND_MAX_BYTES = 2 ** 32
"""K and V copied once per query head (as the naive backend does for GQA) up to this size; above it (an MLA
cache of 576-wide rows under 128 heads, a long GQA batch) each K/V head multiplies its group's query rows stacked
instead, and dK/dV are summed over the group inside the matmul (in fp32) rather than per head in the dtype."""


def _math_rows(q_blk, k, v, keep, scale: float, mods=(), rows=None, row_feature=None):
    """naive attention of query rows ``q_blk`` (B, rows, Hq, D) against all keys; returns (out bshd, lse bhs).
    ``mods``: the score features' plain forms; ``row_feature``: (feature, its input in the dtype) or None."""
    bsz, n, hq, _ = q_blk.shape
    hkv = k.shape[2]
    groups = hq // hkv
    stacked = groups > 1 and bsz * hq * k.shape[1] * (k.shape[3] + v.shape[3]) * k.element_size() > EXPAND_MAX_BYTES
    if stacked:  # each K/V head multiplies its group's query rows stacked, never copied per query head
        qh = q_blk.reshape(bsz, n, hkv, groups, -1).permute(0, 2, 3, 1, 4).reshape(bsz, hkv, groups * n, -1)
        scores = (torch.matmul(qh, k.transpose(1, 2).transpose(-2, -1)) * scale).view(bsz, hq, n, -1)
    else:
        qh = q_blk.transpose(1, 2)
        kh = expand_kv_heads(k, groups).transpose(1, 2)
        scores = torch.matmul(qh, kh.transpose(-2, -1)) * scale
    for mod in mods:
        scores = mod(scores, rows)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if row_feature is not None:
        probs, lse = row_feature[0].softmax(scores, row_feature[1])
    else:
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1)
        if keep is not None and not bool(keep.any(dim=1).all()):
            probs = probs.masked_fill(~keep.any(dim=1, keepdim=True), 0.0)  # rows with no key: 0, not NaN
    if stacked:
        out = torch.matmul(probs.reshape(bsz, hkv, groups * n, -1), v.transpose(1, 2)).view(bsz, hq, n, -1)
        return out.transpose(1, 2), lse
    return torch.matmul(probs, expand_kv_heads(v, groups).transpose(1, 2)).transpose(1, 2), lse


def _dense(spec: AttnSpec, q, k, v, dout, grads: bool, max_elems: int, extra: dict) -> dict[str, torch.Tensor]:
    bsz, sq, hq, _ = q.shape
    sk = k.shape[1]
    left, right = mask_bounds(spec.causal, spec.window)
    rows = max(1, min(sq, max_elems // max(1, bsz * hq * sk)))
    outs, lses, dqs = [], [], []
    active = features.active(spec)
    per_token = {item.name for f in active for item in f.inputs if item.per_token}
    leaves = {name: t.detach().requires_grad_(grads and name in features.grad_names(spec)) for name, t in extra.items()}
    k_leaf, v_leaf = k.detach().requires_grad_(grads), v.detach().requires_grad_(grads)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dk = torch.zeros(k.shape, dtype=acc, device=k.device) if grads else None
    dv = torch.zeros(v.shape, dtype=acc, device=v.device) if grads else None
    sums = {name: torch.zeros(t.shape, dtype=acc, device=q.device) for name, t in leaves.items()
            if grads and t.requires_grad and name not in per_token}
    blocks: dict[str, list] = {name: [] for name in leaves if grads and leaves[name].requires_grad and name in per_token}
    tile_keep = None if spec.sta is None else spec.sta.tile_keep(hq, q.device)
    mods = [m for f in active if f.stage == "score" if (m := f.score_mod(getattr(spec, f.name), sq, sk, q.device))]
    for a in range(0, sq, rows):
        b = min(sq, a + rows)
        keep = block_keep(a, b, 0, sk, sq, sk, left, right, q.device)
        if spec.tree is not None:
            keep = keep_mask(sq, sk, True, device=q.device, tree=spec.tree)[a:b]
        if spec.sta is not None:  # (Hq, rows, keys): each head its own window
            keep = spec.sta.block(a, b, 0, sk, hq, q.device, tile_keep=tile_keep)
        q_leaf = q[:, a:b].detach().requires_grad_(grads)
        with torch.set_grad_enabled(grads):
            # a per-head input in the case's dtype, as a model holding it as a parameter of that dtype has it
            block = {name: (t[:, a:b] if name in per_token else t.to(q.dtype)) for name, t in leaves.items()}
            row = next(((f, block[f.name]) for f in active if f.stage == "rows"), None)
            out, lse = _math_rows(q_leaf, k_leaf, v_leaf, keep, spec.softmax_scale, mods, slice(a, b), row)
            for f in active:
                if f.stage == "output":
                    out = f.output(out, block[f.name])
        if grads:
            wrt_names = [name for name in leaves if leaves[name].requires_grad]
            wrt = (q_leaf, k_leaf, v_leaf) + tuple(leaves[name] for name in wrt_names)
            dq_blk, dk_blk, dv_blk, *rest = torch.autograd.grad(out, wrt, dout[:, a:b], allow_unused=True)
            dqs.append(dq_blk)
            dk += dk_blk
            dv += dv_blk
            for name, grad in zip(wrt_names, rest, strict=True):
                if name in per_token:
                    blocks[name].append(grad[:, a:b])
                else:
                    sums[name] += grad
        outs.append(out.detach())
        lses.append(lse.detach())
    result = {"out": torch.cat(outs, dim=1), "lse": torch.cat(lses, dim=2)}
    if grads:
        result.update(dq=torch.cat(dqs, dim=1), dk=dk.to(k.dtype), dv=dv.to(v.dtype))
        for name, total in sums.items():  # the float32 leaf's gradient: a sum over rows, accumulated in fp32
            result[grad_name(name)] = total
        for name, parts in blocks.items():
            result[grad_name(name)] = torch.cat(parts, dim=1)
    return result


def math_baseline(spec: AttnSpec, inputs: AttnInputs, *, grads: bool = True,
                  max_elems: int = MAX_SCORE_ELEMS) -> dict[str, torch.Tensor]:
    """out, lse (and dq, dk, dv and the features' gradients) of plain math in ``spec.dtype``, shaped like the
    reference's."""
    extra = {item.name: inputs.extra[item.name] for item in features.inputs_of(spec)}
    per_token = {item.name for item in features.inputs_of(spec) if item.per_token}
    if not inputs.varlen:
        return _dense(spec, inputs.q, inputs.k, inputs.v, inputs.dout, grads, max_elems, extra)
    parts = []
    for (a, b), (c, d) in inputs.bounds():
        k, v = inputs.request_kv(c, d)  # a shared prefix in front of the request's own keys
        mine = {name: (t[None, a:b] if name in per_token else t) for name, t in extra.items()}
        parts.append(_dense(spec, inputs.q[None, a:b], k[None], v[None], inputs.dout[None, a:b], grads, max_elems,
                            mine))
    result = {"out": torch.cat([p["out"][0] for p in parts]), "lse": torch.cat([p["lse"][0] for p in parts], dim=1)}
    if grads:
        for name in parts[0]:
            if name in ("out", "lse"):
                continue
            if name in ("dq", "dk", "dv") or name[1:] in per_token:
                result[name] = torch.cat([p[name][0] for p in parts])
            else:  # one value per head for every sequence: the gradients add up
                result[name] = torch.stack([p[name] for p in parts]).sum(0)
    return result

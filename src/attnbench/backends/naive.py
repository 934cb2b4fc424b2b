"""Naive attention in plain PyTorch: matmul, softmax, matmul (the write-ups' "Pytorch" implementation).

Materialises the full (B, H, Sq, Sk) score matrix in the input dtype, as a hand-written model would.
GQA repeats K/V heads; varlen loops over the sequences. Rows whose mask keeps no key output zeros
(flash-attn's convention) instead of NaN. A serving batch runs a request at a time; a tree of speculative
tokens is part of the boolean mask; an fp8 KV cache is dequantized inside the call (as a kernel without fp8
support would have to).

The features of today's models (``attnbench.features``) are written as a model would, in each feature's plain form
(``Feature.score_mod``, ``softmax``, ``output``): a softcap and an fp32 ALiBi bias on the score matrix, the sinks as
one more softmax column per row that is dropped afterwards, an output gate after the call.

Two forms, which differ only in where the softmax scale is applied:

- ``naive``: the scale folded into Q before the first matmul (B·S·H·D multiplies), as careful model
  code and flash-attention's own reference do; flash-attention's benchmark applies it inside the
  GEMM (``baddbmm(alpha=scale)``), which costs the same. This is the baseline attnbench compares with.
- ``naive-scale-scores``: the scale applied to the S×S score matrix after the matmul, as many
  hand-written scripts do: one more read and write of the largest tensor of the computation (on an
  H100, B=2 S=8k D=128: 73.8 TF/s instead of 94.5). Offered so a "× faster than PyTorch" figure
  made with that form can be reproduced, and named so it is not mistaken for the fair baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench import features
from attnbench.backends.base import Backend, Capabilities, Prepared, autograd_closure, expand_kv_heads
from attnbench.inputs import AttnInputs, kv_dequantizer
from attnbench.masks import keep_mask
from attnbench.spec import MAX_HEAD_DIM, AttnSpec


def naive_attention(q_bshd: torch.Tensor, k_bshd: torch.Tensor, v_bshd: torch.Tensor, *, causal: bool,
                    window: tuple[int, int] | None, scale: float, mask: _Mask | None = None,
                    scale_scores: bool = False, terms: Terms | None = None, **named: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V for (B, S, H, D) tensors; returns (B, Sq, Hq, Dv).

    ``mask`` is the precomputed ``_Mask`` of (causal, window) for these lengths; built here if absent.
    ``scale_scores``: multiply the score matrix by the scale instead of Q (module docstring).
    ``terms``: the case's score and row features; ``named``: the row feature's input by name (``sinks=``).
    """
    groups = q_bshd.shape[2] // k_bshd.shape[2]
    q = q_bshd.transpose(1, 2)
    k = expand_kv_heads(k_bshd, groups).transpose(1, 2)
    v = expand_kv_heads(v_bshd, groups).transpose(1, 2)
    if mask is None:
        mask = _Mask.build(q.shape[2], k.shape[2], causal, window, q.device)
    if scale_scores:
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    else:
        scores = torch.matmul(q * scale, k.transpose(-2, -1))
    for mod in terms.mods if terms is not None else ():
        scores = mod(scores, None)
    if mask.drop is not None:
        scores = scores.masked_fill(mask.drop, float("-inf"))
    row = terms.row if terms is not None else None
    if row is None:  # a row feature's input given without terms (``naive_attention(q, k, v, sinks=...)``)
        row = next((f for f in features.FEATURES if f.stage == "rows" and named.get(f.name) is not None), None)
    if row is None:
        probs = torch.softmax(scores, dim=-1)
        if mask.empty_rows is not None:
            probs = probs.masked_fill(mask.empty_rows, 0.0)
    else:  # a row feature's softmax (a row with no key keeps its sink: its probabilities are all 0, no NaN)
        probs, _ = row.softmax(scores, named[row.name])
    return torch.matmul(probs, v).transpose(1, 2)


@dataclass(frozen=True)
class _Mask:
    """Masked-out positions and rows with no key at all (None when there are none)."""

    drop: torch.Tensor | None
    empty_rows: torch.Tensor | None

    @staticmethod
    def build(sq: int, sk: int, causal: bool, window, device, tree=None) -> _Mask:
        keep = keep_mask(sq, sk, causal, window, device=device, tree=tree)
        if keep is None:
            return _Mask(None, None)
        has_key = keep.any(dim=1, keepdim=True)
        return _Mask(~keep, None if bool(has_key.all()) else ~has_key)


@dataclass(frozen=True)
class Terms:
    """The score features' plain forms of one sequence, their buffers built once like a model's, and the row
    feature (``attnbench.features``)."""

    mods: tuple
    """``fn(scores, rows)`` of each score feature, in order."""
    row: features.Feature | None
    """The row feature whose softmax replaces the plain one, or None."""

    @staticmethod
    def build(spec: AttnSpec, sq: int, sk: int, device) -> Terms | None:
        active = features.active(spec)
        mods = tuple(m for f in active if f.stage == "score"
                     if (m := f.score_mod(getattr(spec, f.name), sq, sk, device)) is not None)
        row = next((f for f in active if f.stage == "rows"), None)
        return Terms(mods, row) if mods or row is not None else None


class NaiveBackend(Backend):
    name = "naive"
    description = "matmul-softmax-matmul in PyTorch, full score matrix, scale folded into Q (the write-ups' 'Pytorch')"
    capabilities = Capabilities(max_head_dim=MAX_HEAD_DIM, varlen=True, window=True, tile_mask=True, sinks=True,
                                softcap=True, alibi=True, gate=True, tree=True, kv_fp8=True)
    scale_scores = False
    """Apply the softmax scale to the S×S scores instead of Q (``naive-scale-scores``)."""

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        # Masks are built here, once: a hand-written model would keep them as buffers.
        kwargs = dict(causal=spec.causal, window=spec.window, scale=spec.softmax_scale, scale_scores=self.scale_scores)
        dev, kv = inputs.q.device, kv_dequantizer(inputs, spec.torch_dtype)
        if not inputs.varlen:
            sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
            mask = _Mask.build(sq, sk, spec.causal, spec.window, dev, spec.tree)
            terms = Terms.build(spec, sq, sk, dev)
            if spec.sta is not None:  # (Hq, S, S), each head its own window; every query attends some key
                mask = _Mask(~spec.sta.dense(spec.heads_q, dev), None)

            def forward(q, k, v, **named):
                return naive_attention(q, *kv(k, v), mask=mask, terms=terms, **named, **kwargs)
        else:
            bounds = inputs.bounds()
            masks = [_Mask.build(qe - qs, ke - ks, spec.causal, spec.window, dev, spec.tree)
                     for (qs, qe), (ks, ke) in bounds]
            terms = [Terms.build(spec, qe - qs, ke - ks, dev) for (qs, qe), (ks, ke) in bounds]

            def forward(q, k, v, **named):
                k, v = kv(k, v)
                outs = [naive_attention(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], mask=m, terms=t, **named,
                                        **kwargs)[0]
                        for ((qs, qe), (ks, ke)), m, t in zip(bounds, masks, terms, strict=True)]
                return torch.cat(outs, dim=0)
        kernel = "matmul+scale+softmax+matmul" if self.scale_scores else "matmul(scaled q)+softmax+matmul"
        info = self.base_info() | {"kernel": kernel, "gqa": "expanded" if spec.gqa else "none"}
        return Prepared(fn=autograd_closure(spec, inputs, forward), info=info)


class NaiveScaleScoresBackend(NaiveBackend):
    name = "naive-scale-scores"
    description = "naive with the scale applied to the S×S scores (one more pass over them), as many scripts do"
    scale_scores = True
    default_sweep = False

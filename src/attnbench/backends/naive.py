"""Naive attention in plain PyTorch: matmul, softmax, matmul (the seeds' "Pytorch" implementation).

Materialises the full (B, H, Sq, Sk) score matrix in the input dtype, as a hand-written model would.
GQA repeats K/V heads; varlen loops over the sequences. Rows whose mask keeps no key output zeros
(flash-attn's convention) instead of NaN.
"""

from __future__ import annotations

import torch

from attnbench.backends.base import Backend, Capabilities, Prepared, autograd_closure, expand_kv_heads
from attnbench.inputs import AttnInputs, split_varlen
from attnbench.masks import keep_mask
from attnbench.spec import AttnSpec


def naive_attention(q_bshd: torch.Tensor, k_bshd: torch.Tensor, v_bshd: torch.Tensor, *, causal: bool,
                    window: tuple[int, int] | None, scale: float) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V for (B, S, H, D) tensors; returns (B, Sq, Hq, Dv)."""
    groups = q_bshd.shape[2] // k_bshd.shape[2]
    q = q_bshd.transpose(1, 2)
    k = expand_kv_heads(k_bshd, groups).transpose(1, 2)
    v = expand_kv_heads(v_bshd, groups).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    keep = keep_mask(q.shape[2], k.shape[2], causal, window, device=q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if keep is not None and not bool(keep.any(dim=1).all()):
        probs = probs.masked_fill(~keep.any(dim=1, keepdim=True), 0.0)
    return torch.matmul(probs, v).transpose(1, 2)


class NaiveBackend(Backend):
    name = "naive"
    description = "matmul-softmax-matmul in PyTorch, full score matrix (seed 'Pytorch')"
    capabilities = Capabilities(varlen=True, window=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        kwargs = dict(causal=spec.causal, window=spec.window, scale=spec.softmax_scale)
        if not inputs.varlen:
            def forward(q, k, v):
                return naive_attention(q, k, v, **kwargs)
        else:
            cu_q, cu_k = inputs.cu_seqlens_q, inputs.cu_seqlens_k

            def forward(q, k, v):
                outs = [naive_attention(qs[None], ks[None], vs[None], **kwargs)[0]
                        for qs, ks, vs in zip(split_varlen(q, cu_q), split_varlen(k, cu_k),
                                              split_varlen(v, cu_k), strict=True)]
                return torch.cat(outs, dim=0)
        info = self.base_info() | {"kernel": "matmul+softmax+matmul", "gqa": "expanded" if spec.gqa else "none"}
        return Prepared(fn=autograd_closure(spec, inputs, forward), info=info)

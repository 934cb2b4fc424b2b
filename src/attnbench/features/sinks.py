"""Attention sinks (gpt-oss): one learned logit per query head in every row's softmax denominator.

One logit ``sink_h`` per query head joins every row's softmax denominator and takes no value:
``o_i = Σ_j p_ij v_j`` with ``p_ij = exp(s_ij) / (Σ_k exp(s_ik) + exp(sink_h))``. The row's log-sum-exp
includes it (``lse_i = log(Σ_k exp(s_ik) + exp(sink_h))``), so a row with no key has ``lse = sink_h`` and
``o = 0``. Sinks are trained: the backward pass gives ``d sink_h = −Σ_rows exp(sink_h − lse_i) · Σ_d dO_id · O_id``.

**Inputs that make it matter.** The sink logits are an input of the case, seeded like q, k and v: ``ln(mean
Sk) + 0.5 + N(0, 1)`` per head. With N(0, 1) inputs a row's log-sum-exp is about ``ln(Sk) + 0.5``, so each sink
takes roughly a quarter to three quarters of its row's weight — a kernel that ignored the sinks would be off by
tens of percent, not by rounding, and the check cannot miss it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnbench.features.base import FeatureInput, Option, Switch

SINK_SHIFT = 0.5
"""Added to ln(Sk) in ``draw_sinks``: the log-sum-exp of N(0, 1) scores over Sk keys is about ln(Sk) + 1/2."""


def with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """(..., H, Sq, Sk) scores with one more column per row holding ``sinks[h]``: a softmax over the result gives
    the sink its share of each row, and its last column is dropped afterwards (how gpt-oss writes it)."""
    import torch
    column = sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, column], dim=-1)


def draw_sinks(heads: int, seqlens_k: tuple[int, ...], generator: torch.Generator,
               device: torch.device) -> torch.Tensor:
    """float32 (heads,) sink logits: ``ln(mean Sk) + SINK_SHIFT + N(0, 1)`` (module doc)."""
    import torch
    mean_sk = sum(seqlens_k) / len(seqlens_k)
    noise = torch.randn(heads, generator=generator, device=device, dtype=torch.float32)
    return noise + (math.log(mean_sk) + SINK_SHIFT)


class Sinks(Switch):
    name = "sinks"
    title = "attention sinks"
    refusal = "attention sinks not supported"
    stage = "rows"
    options = (Option("sinks", ("--sinks", "--no-sinks"), "[both]",
                      "Attention sinks (gpt-oss): one seeded logit per query head in every softmax; --sinks both "
                      "runs both."),)
    inputs = (FeatureInput("sinks", per_token=False),)

    def draw(self, spec, gen, device, like_out):
        return {"sinks": draw_sinks(spec.heads_q, spec.seqlens_k, gen, device)}

    def softmax(self, scores, tensor):
        # the sink is one more column of every row, dropped after the softmax; a row with no key keeps its sink
        scores = with_sinks(scores, tensor)
        return scores.softmax(dim=-1)[..., :-1], scores.logsumexp(dim=-1)

    def rows_forward(self, out, lse, tensor, dtype):
        # the sink joins each row's denominator: rescale out, add it to the LSE
        groups = lse.shape[1]
        sink = tensor.to(dtype).view(-1, groups, 1)  # (Hkv, G, 1), repeated over the batch
        sink = sink.repeat(lse.shape[0] // sink.shape[0], 1, 1)
        total = lse.logaddexp(sink.expand_as(lse))
        out.mul_((lse - total).exp().unsqueeze(-1))
        return out, total

    def rows_grad(self, out, dout, lse, tensor, dtype, rows):
        """d sink_h = −Σ over batch and rows of exp(sink_h − lse) · Σ_d dO·O, in ``dtype``, (Hq,)."""
        import torch
        grad = torch.zeros(tensor.shape[0], dtype=dtype, device=out.device)
        sink = tensor.to(dtype).view(1, -1, 1)
        for a in range(0, out.shape[1], rows):  # rows at a time: no (B, S, H, D) temporary in the compute dtype
            delta = torch.einsum("bshd,bshd->bhs", dout[:, a:a + rows].to(dtype), out[:, a:a + rows].to(dtype))
            grad -= (torch.exp(sink - lse[:, :, a:a + rows].to(dtype)) * delta).sum(dim=(0, 2))
        return grad


FEATURE = Sinks()

if TYPE_CHECKING:
    import torch

"""Ulysses (DeepSpeed) sequence parallelism: all-to-all from sequence shards to head shards and back.

Each of the U ranks holds (B, S/U, H, D). One ``all_to_all_single`` turns that into (B, S, H/U, D):
the full sequence for a slice of heads; the local kernel runs on it unchanged (causal included,
since the gathered sequence is in order for the contiguous layout); a second all-to-all returns the
output to sequence shards. The all-to-all is its own adjoint with the dims swapped, which is the
backward. Query and key/value head counts must both divide by U (rank j keeps q-heads
[j*Hq/U, (j+1)*Hq/U) and the kv-heads they read under GQA).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attnbench.distributed import timeline
from attnbench.distributed.comm import all_to_all
from attnbench.distributed.kernels import LocalKernel, local_attention


def check_heads(heads_q: int, heads_kv: int, degree: int) -> None:
    """ValueError unless both head counts divide by the Ulysses degree."""
    bad = [f"{name} ({n})" for name, n in (("q-heads", heads_q), ("kv-heads", heads_kv)) if n % degree]
    if bad:
        raise ValueError(f"Ulysses degree {degree} must divide the head counts, but {' and '.join(bad)} "
                         f"{'is' if len(bad) == 1 else 'are'} not a multiple of {degree}; "
                         "use a smaller --ulysses-degree or the ring method")


def _seq_to_heads(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """(B, S/U, H, D) -> (B, S, H/U, D)."""
    b, s, h, d = x.shape
    send = x.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    all_to_all(recv, send, group)  # recv[j] = rank j's sequence chunk of my heads
    return recv.permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)


def _heads_to_seq(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """(B, S, H/U, D) -> (B, S/U, H, D)."""
    b, s, h, d = x.shape
    send = x.reshape(b, world, s // world, h, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    all_to_all(recv, send, group)  # recv[j] = my sequence chunk of rank j's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // world, world * h, d)


class SeqToHeads(torch.autograd.Function):
    """Differentiable sequence-shard -> head-shard all-to-all."""

    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        return _seq_to_heads(x, group, world)

    @staticmethod
    def backward(ctx, grad):
        out = _heads_to_seq(grad.contiguous(), ctx.group, ctx.world)
        timeline.mark("a2a")
        return out, None, None


class HeadsToSeq(torch.autograd.Function):
    """Differentiable head-shard -> sequence-shard all-to-all."""

    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        return _heads_to_seq(x, group, world)

    @staticmethod
    def backward(ctx, grad):
        timeline.begin_step("bwd", 0)  # the first thing Ulysses' backward does
        out = _seq_to_heads(grad.contiguous(), ctx.group, ctx.world)
        timeline.mark("a2a")
        return out, None, None


def ulysses_attention(q, k, v, *, kernel: LocalKernel, causal: bool, scale: float,
                      group: dist.ProcessGroup | None = None, inner=None) -> torch.Tensor:
    """Attention of contiguous sequence shards q (B, S/U, Hq, D), k, v (B, S/U, Hkv, D) over ``group``.

    ``inner(q, k, v)`` replaces the local kernel call on the gathered (B, S, H/U, D) tensors (USP
    passes ring attention over the other mesh axis here).
    """
    world = dist.get_world_size(group)
    check_heads(q.shape[2], k.shape[2], world)
    timeline.begin_step("fwd", 0)
    if world == 1:
        qh, kh, vh = q, k, v
    else:
        qh, kh, vh = (SeqToHeads.apply(t.contiguous(), group, world) for t in (q, k, v))
        timeline.mark("a2a")
    if inner is None:
        out = local_attention(qh, kh, vh, kernel, causal, scale)
    else:
        out = inner(qh, kh, vh)
    if world == 1:
        return out
    out = HeadsToSeq.apply(out.contiguous(), group, world)
    timeline.mark("a2a")
    return out

"""Ulysses (DeepSpeed) sequence parallelism: all-to-all from sequence shards to head shards and back.

Each of the U ranks holds (B, S/U, H, D). One ``all_to_all_single`` turns that into (B, S, H/U, D):
the full sequence for a slice of heads; the local kernel runs on it unchanged (causal included,
since the gathered sequence is in order for the contiguous layout); a second all-to-all returns the
output to sequence shards. The all-to-all is its own adjoint with the dims swapped, which is the
backward. Query and key/value head counts must both divide by U (rank j keeps q-heads
[j*Hq/U, (j+1)*Hq/U) and the kv-heads they read under GQA).

**The forward pipelined over head chunks** (``chunks`` P > 1, a forward without gradients on NCCL): each
rank's heads are split into P chunks, and chunk c's all-to-alls run while the kernel computes chunk c − 1:
the inputs of chunk c + 1 are posted before chunk c's kernel starts, and each chunk's output travels back
while the next one computes. The transfers run on NCCL's stream, the kernels on the compute stream; what
the kernel cannot hide is the first chunk's inputs and the last chunk's output, 1/P of the all-to-alls each.
The result is the same attention (each head's computation is unchanged); a backward pass keeps the one-shot
all-to-alls, whose cost the backward's longer kernels already hide. ``auto`` takes the largest P in
``PIPELINE_CHUNKS`` that divides both head counts per rank. Measured on 4 H200s (FA3, 32 heads of 128, causal,
2026-11-28, ``docs/results/context-parallel.md``): the exposed all-to-all fell from 5-6 ms to 0.7 ms a call at
128k, but the four smaller kernels ran 1-2 ms longer and the first chunk's inputs added 3.5-4.5 ms of waiting,
so the forward was 0.3% faster at 128k and 2.7% slower at 256k: ``dist`` keeps P = 1 unless asked.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attnbench.distributed import copy_engine, timeline
from attnbench.distributed.comm import _staged, all_to_all
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


PIPELINE_CHUNKS = (4, 2, 1)
"""Head chunks the pipelined forward tries, largest first (``chunks="auto"``)."""


def pipeline_chunks(heads_q: int, heads_kv: int, world: int, chunks: int | str = "auto") -> int:
    """The head chunks per rank of the pipelined forward: ``chunks``, or the largest of ``PIPELINE_CHUNKS``
    dividing both head counts per rank; ValueError when a given count does not divide them."""
    per_q, per_kv = heads_q // world, heads_kv // world
    if chunks == "auto":
        return next(p for p in PIPELINE_CHUNKS if per_q % p == 0 and per_kv % p == 0)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or per_q % chunks or per_kv % chunks:
        raise ValueError(f"Ulysses chunks must divide the heads each rank holds ({per_q} q-heads, {per_kv} "
                         f"kv-heads), got {chunks!r}")
    return chunks


def _chunk_send(x: torch.Tensor, world: int, chunks: int, c: int) -> torch.Tensor:
    """(B, S/U, H, D) -> (U, B, S/U, H/(U·P), D): for each rank j, chunk c of the heads j will hold."""
    b, s, h, d = x.shape
    return x.reshape(b, s, world, chunks, h // (world * chunks), d)[:, :, :, c].permute(2, 0, 1, 3, 4).contiguous()


def _pipelined_forward(q, k, v, kernel: LocalKernel, causal: bool, scale: float, group, world: int,
                       chunks: int) -> torch.Tensor:
    """The forward of ``ulysses_attention`` with each chunk's all-to-alls under the previous chunk's kernel."""
    b, s, hq, _ = q.shape

    def post(c):  # the inputs of chunk c: three asynchronous all-to-alls; recv[j] = rank j's sequence chunk
        sends = [_chunk_send(t, world, chunks, c) for t in (q, k, v)]
        recvs = [torch.empty_like(t) for t in sends]
        works = [dist.all_to_all_single(r, t, group=group, async_op=True) for r, t in zip(recvs, sends, strict=True)]
        return recvs, works, sends  # the sends stay referenced until their transfer is waited for

    returns = []
    posted = post(0)
    for c in range(chunks):
        recvs, works, _ = posted
        for work in works:
            work.wait()
        timeline.mark("wait")
        if c + 1 < chunks:
            posted = post(c + 1)  # travels while this chunk computes
        qh, kh, vh = (r.permute(1, 0, 2, 3, 4).reshape(b, world * s, r.shape[3], r.shape[4]) for r in recvs)
        o = kernel.fwd(qh.contiguous(), kh.contiguous(), vh.contiguous(), causal, scale)[0]
        timeline.mark("kernel")
        send = o.reshape(b, world, s, o.shape[2], o.shape[3]).transpose(0, 1).contiguous()  # [j]: j's sequence
        recv = torch.empty_like(send)  # recv[j] = my sequence chunk of rank j's heads, chunk c
        returns.append((recv, dist.all_to_all_single(recv, send, group=group, async_op=True), send))
    out = torch.empty(b, s, world, chunks, hq // (world * chunks), returns[0][0].shape[-1], dtype=q.dtype,
                      device=q.device)
    for c, (recv, work, _) in enumerate(returns):
        work.wait()
        out[:, :, :, c] = recv.permute(1, 2, 0, 3, 4)
    timeline.mark("a2a")
    return out.reshape(b, s, hq, -1)


def ulysses_attention(q, k, v, *, kernel: LocalKernel, causal: bool, scale: float,
                      group: dist.ProcessGroup | None = None, inner=None, chunks: int | str = 1,
                      a2a: str = "nccl") -> torch.Tensor:
    """Attention of contiguous sequence shards q (B, S/U, Hq, D), k, v (B, S/U, Hkv, D) over ``group``.

    ``inner(q, k, v)`` replaces the local kernel call on the gathered (B, S, H/U, D) tensors (USP
    passes ring attention over the other mesh axis here). ``chunks``: head chunks of the pipelined
    forward (module doc), used for a forward without gradients on a transport that moves device memory.
    ``a2a="copy-engine"``: that forward's all-to-alls are peer-to-peer copies on the copy engines
    (``copy_engine``), which take no SMs from the kernel; with gradients it is NCCL's, as ever.
    """
    world = dist.get_world_size(group)
    check_heads(q.shape[2], k.shape[2], world)
    timeline.begin_step("fwd", 0)
    p = pipeline_chunks(q.shape[2], k.shape[2], world, chunks) if world > 1 and inner is None else 1
    if a2a == "copy-engine" and world > 1 and inner is None and not torch.is_grad_enabled():
        return copy_engine.forward(q, k, v, kernel=kernel, causal=causal, scale=scale, group=group, chunks=p)
    if p > 1 and not torch.is_grad_enabled() and not _staged(q, group):
        return _pipelined_forward(q, k, v, kernel, causal, scale, group, world, p)
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

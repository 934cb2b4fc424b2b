"""Ring attention over a process group, with any local kernel that returns the log-sum-exp.

Each rank holds a shard of q, k, v (bshd, sequence dim 1). K/V travel around the ring with
``batch_isend_irecv``; the transfer for step s+1 is posted before step s is computed, so the
communication overlaps the local kernel. Partial results are merged in fp32 in the log-sigmoid form,
which never exponentiates a large LSE (applied in place, as a lerp)::

    out = out - sigmoid(block_lse - lse) * (out - block_out)
    lse = lse - logsigmoid(lse - block_lse)

Backward: dQ accumulates locally in fp32; dK/dV accumulators (fp32) travel around the ring with the
K/V block they belong to and arrive back at the owner after a full turn.

Causal masks: with the ``contiguous`` layout rank i only needs K/V of ranks <= i (rank 0 idles most
of the time); with the ``zigzag`` layout (rank i holds chunks i and 2N-1-i) every step is half a
block on every rank. Per step, given the rank ``src`` whose K/V is held:

- src == rank: the local block with the diagonal causal mask;
- zigzag, src < rank: all local queries against the first half of the K/V shard, unmasked;
- zigzag, src > rank: the second half of the local queries against the whole K/V shard, unmasked;
- contiguous: src < rank full, src > rank skipped.

``comm="allgather"`` gathers every K/V shard first (one collective, more memory) and returns dK/dV
to their owners with one reduction, instead of passing blocks around.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnbench.distributed import comm as xfer
from attnbench.distributed import documents, timeline
from attnbench.distributed.kernels import LocalKernel
from attnbench.distributed.layout import runs, zigzag_shard, zigzag_unshard  # noqa: F401  (public helpers)

DIAG, FULL, SKIP, KV_FRONT, Q_BACK = "diag", "full", "skip", "kv_front", "q_back"
COMMS = ("p2p", "allgather")


def block_kind(rank: int, src: int, causal: bool, zigzag: bool) -> str:
    """What rank ``rank`` computes with the K/V shard of rank ``src`` (see the module doc)."""
    if not causal:
        return FULL
    if src == rank:
        return DIAG
    if zigzag:
        return KV_FRONT if src < rank else Q_BACK
    return FULL if src < rank else SKIP


class RingComm:
    """Send to the next rank, receive from the previous one, within ``group``."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world))
        self.next_peer = ranks[(self.rank + 1) % self.world]
        self.prev_peer = ranks[(self.rank - 1) % self.world]

    def exchange(self, tensors) -> tuple[list[torch.Tensor], list]:
        """Post sends of ``tensors`` to the next rank and receives of the same shapes from the previous one."""
        return xfer.send_recv(tensors, self.next_peer, self.prev_peer, self.group)


def _wait(reqs: list) -> None:
    """Wait for the requests and empty the list: a second wait on a finished gloo send never returns."""
    while reqs:
        reqs.pop(0).wait()


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge(out, lse, block_out, block_lse):
    """Merge a block into the running (out (B,S,H,D), lse (B,S,H,1)) in place; block_lse is (B,H,S).

    ``out - sigmoid(block_lse - lse) * (out - block_out)`` is a lerp towards the block with weight
    sigmoid(block_lse - lse): one fused pass over ``out`` (views such as out[:, h:] work too).
    """
    block_lse = block_lse.transpose(1, 2).unsqueeze(-1).to(lse.dtype)
    out.lerp_(block_out.to(out.dtype), torch.sigmoid(block_lse - lse))
    lse.sub_(F.logsigmoid(lse - block_lse))
    return out, lse


def _kfwd(kernel: LocalKernel, q, k, v, causal, scale, where):
    """The kernel's (out, lse) of one block; under packed documents (``where`` = docs, query rows, key rows) the
    document mask's, or None when the block shares no document."""
    if where is None:
        return kernel.fwd(q, k, v, causal, scale)
    return documents.fwd(kernel, where[0], q, k, v, causal, scale, where[1], where[2])


def _kbwd(kernel: LocalKernel, dout, q, k, v, out, lse, causal, scale, where):
    if where is None:
        return kernel.bwd(dout, q, k, v, out, lse, causal, scale)
    return documents.bwd(kernel, where[0], dout, q, k, v, out, lse, causal, scale, where[1], where[2])


def _q_back(where, n):
    return None if where is None else (where[0], documents.back(where[1], n), where[2])


def _kv_front(where, n):
    return None if where is None else (where[0], where[1], documents.front(where[2], n))


def _fwd_block(kernel: LocalKernel, kind: str, q, k, v, state, scale, where=None):
    """Run one block and merge it into ``state`` = [out, lse] (in place on the list)."""
    if kind == SKIP:
        return
    if kind == Q_BACK:
        h = q.shape[1] // 2
        res = _kfwd(kernel, q[:, h:], k, v, False, scale, _q_back(where, q.shape[1] - h))
        timeline.mark("kernel")
        if res is not None:
            merge(state[0][:, h:], state[1][:, h:], *res)
            timeline.mark("merge")
        return
    if kind == KV_FRONT:
        h = k.shape[1] // 2
        k, v, where = k[:, :h], v[:, :h], _kv_front(where, h)
    res = _kfwd(kernel, q, k, v, kind == DIAG, scale, where)
    timeline.mark("kernel")
    if res is None:
        return
    bo, bl = res
    if state[0] is None:  # the first block (always the local one) starts the accumulators
        acc = _acc_dtype(q.dtype)
        state[0], state[1] = bo.to(acc), bl.transpose(1, 2).unsqueeze(-1).to(acc)
    else:
        merge(state[0], state[1], bo, bl)
    timeline.mark("merge")


def _bwd_block(kernel: LocalKernel, kind: str, dout, q, k, v, out, lse, scale, dq, dkv, where=None) -> None:
    """Add one block's gradients into the fp32 accumulators dq (local) and dK, dV (travelling).

    ``dkv()`` returns the dK, dV accumulators; it is called only after the block's kernel is launched,
    so that in the ring the accumulators can still be on their way from the previous rank while the
    kernel runs (their wait orders the additions, not the kernel)."""
    if kind == SKIP:
        return
    if kind == Q_BACK:
        h = q.shape[1] // 2
        res = _kbwd(kernel, dout[:, h:], q[:, h:], k, v, out[:, h:], lse[:, :, h:], False, scale,
                    _q_back(where, q.shape[1] - h))
        timeline.mark("kernel")
        if res is None:
            return
        bdq, bdk, bdv = res
        dq[:, h:] += bdq
        timeline.mark("merge")
        dk, dv = dkv()
        dk += bdk
        dv += bdv
        timeline.mark("merge")
        return
    n = k.shape[1] // 2 if kind == KV_FRONT else k.shape[1]
    res = _kbwd(kernel, dout, q, k[:, :n], v[:, :n], out, lse, kind == DIAG, scale,
                _kv_front(where, n) if kind == KV_FRONT else where)
    timeline.mark("kernel")
    if res is None:
        return
    bdq, bdk, bdv = res
    dq += bdq
    timeline.mark("merge")
    dk, dv = dkv()
    dk[:, :n] += bdk
    dv[:, :n] += bdv
    timeline.mark("merge")


def _where(docs, comm: RingComm, src: int, zigzag: bool, local_len: int):
    """(docs, this rank's rows, rank ``src``'s rows) under packed documents, else None."""
    if docs is None:
        return None
    layout, total = ("zigzag" if zigzag else "contiguous"), local_len * comm.world
    return (docs, runs(total, layout, comm.rank, comm.world), runs(total, layout, src, comm.world))


def ring_forward(kernel, q, k, v, causal, scale, comm: RingComm, zigzag: bool, docs=None):
    """Local (out (B,S,H,D) in q's dtype, lse (B,H,S) fp32) after a full turn of K/V."""
    state = [None, None]
    kv = (k, v)
    for step in range(comm.world):
        if step + 1 < comm.world:
            nxt, reqs = comm.exchange(kv)
        timeline.begin_step("fwd", step)
        src = (comm.rank - step) % comm.world
        _fwd_block(kernel, block_kind(comm.rank, src, causal, zigzag), q, kv[0], kv[1], state, scale,
                   _where(docs, comm, src, zigzag, q.shape[1]))
        if step + 1 < comm.world:
            _wait(reqs)
            kv = tuple(nxt)
            timeline.mark("wait")
    out, lse = state
    return out.to(q.dtype), lse.squeeze(-1).transpose(1, 2).contiguous()


def ring_backward(kernel, dout, q, k, v, out, lse, causal, scale, comm: RingComm, zigzag: bool, docs=None):
    """(dq, dk, dv) of the local shard; dk/dv accumulate in fp32 while travelling with their K/V.

    The accumulators of a step's K/V block arrive from the previous rank while this rank's kernel for
    that block runs: they are waited for only when the block's dK/dV are added (``_bwd_block``)."""
    acc = _acc_dtype(q.dtype)
    timeline.begin_step("bwd", 0)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = (k, v)
    dkv = [torch.zeros(k.shape, dtype=acc, device=k.device), torch.zeros(v.shape, dtype=acc, device=v.device)]
    timeline.mark("merge")  # zeroing the fp32 accumulators
    dkv_reqs: list = []

    def arrived():
        if dkv_reqs:
            _wait(dkv_reqs)  # the accumulators for this K/V block, from the previous rank
            timeline.mark("wait")
        return dkv
    for step in range(comm.world):
        if step + 1 < comm.world:
            nxt, kv_reqs = comm.exchange(kv)
        timeline.begin_step("bwd", step)
        src = (comm.rank - step) % comm.world
        _bwd_block(kernel, block_kind(comm.rank, src, causal, zigzag), dout, q, kv[0], kv[1], out, lse, scale, dq,
                   arrived, _where(docs, comm, src, zigzag, q.shape[1]))
        if comm.world > 1:
            arrived()  # a skipped block still hands on what it received
            dkv, dkv_reqs = comm.exchange(dkv)
        if step + 1 < comm.world:
            _wait(kv_reqs)
            kv = tuple(nxt)
            timeline.mark("wait")
    if comm.world > 1:
        arrived()  # after a full turn each rank receives its own block's accumulators
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _gather(t: torch.Tensor, comm: RingComm) -> list[torch.Tensor]:
    return xfer.all_gather(t, comm.world, comm.group)


def allgather_forward(kernel, q, k, v, causal, scale, comm: RingComm, zigzag: bool, docs=None):
    """Like ``ring_forward`` but with every K/V shard gathered up front."""
    ks, vs = _gather(k, comm), _gather(v, comm)
    state = [None, None]
    for step in range(comm.world):
        src = (comm.rank - step) % comm.world
        _fwd_block(kernel, block_kind(comm.rank, src, causal, zigzag), q, ks[src], vs[src], state, scale,
                   _where(docs, comm, src, zigzag, q.shape[1]))
    return state[0].to(q.dtype), state[1].squeeze(-1).transpose(1, 2).contiguous()


def allgather_backward(kernel, dout, q, k, v, out, lse, causal, scale, comm: RingComm, zigzag: bool, docs=None):
    """K/V gathered again (not kept from the forward, to save memory); dK/dV reduced to their owners."""
    acc = _acc_dtype(q.dtype)
    ks, vs = _gather(k, comm), _gather(v, comm)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros((comm.world, *k.shape), dtype=acc, device=k.device)
    dv = torch.zeros((comm.world, *v.shape), dtype=acc, device=v.device)
    for step in range(comm.world):
        src = (comm.rank - step) % comm.world
        _bwd_block(kernel, block_kind(comm.rank, src, causal, zigzag), dout, q, ks[src], vs[src], out, lse,
                   scale, dq, lambda src=src: (dk[src], dv[src]), _where(docs, comm, src, zigzag, q.shape[1]))
    dk, dv = _reduce_to_owners(dk, comm), _reduce_to_owners(dv, comm)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _reduce_to_owners(parts: torch.Tensor, comm: RingComm) -> torch.Tensor:
    """Sum over ranks of parts[i], delivered to rank i (gloo has no reduce_scatter: all_reduce there)."""
    if xfer.through_host(comm.group):
        xfer.all_reduce(parts, group=comm.group)
        return parts[comm.rank]
    mine = torch.empty_like(parts[0])
    dist.reduce_scatter_tensor(mine, parts, group=comm.group)
    return mine


class RingAttention(torch.autograd.Function):
    """Differentiable ring attention of local bshd shards."""

    @staticmethod
    def forward(ctx, q, k, v, kernel, causal, scale, group, zigzag, comm_kind, docs):
        comm = RingComm(group)
        fwd = allgather_forward if comm_kind == "allgather" else ring_forward
        out, lse = fwd(kernel, q, k, v, causal, scale, comm, zigzag, docs)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (kernel, causal, scale, comm, zigzag, docs)
        ctx.comm_kind = comm_kind
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        kernel, causal, scale, comm, zigzag, docs = ctx.args
        bwd = allgather_backward if ctx.comm_kind == "allgather" else ring_backward
        dq, dk, dv = bwd(kernel, dout.contiguous(), q, k, v, out, lse, causal, scale, comm, zigzag, docs)
        return dq, dk, dv, None, None, None, None, None, None, None


def ring_attention(q, k, v, *, kernel: LocalKernel, causal: bool, scale: float,
                   group: dist.ProcessGroup | None = None, layout: str = "contiguous",
                   comm: str = "p2p", docs: documents.Documents | None = None) -> torch.Tensor:
    """Attention of the local shards q (B, S/N, Hq, D), k, v (B, S/N, Hkv, D) over ``group``.

    ``layout`` says how the sequence was sharded (``contiguous`` or ``zigzag``, see layout.py); the
    output is the local shard of the full attention output in the same layout. ``docs``: the sequence is
    packed documents (documents.py), attended each within itself.
    """
    if comm not in COMMS:
        raise ValueError(f"unknown ring communication {comm!r}; allowed: {', '.join(COMMS)}")
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"unknown layout {layout!r}; allowed: contiguous, zigzag")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"zigzag shards hold two equal chunks; local length {q.shape[1]} is odd")
    if docs is not None and (q.shape[0] != 1 or q.shape[1] * dist.get_world_size(group) != docs.total):
        raise ValueError(f"packed documents of {docs.total} tokens need one sequence of that length over the ranks")
    return RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), kernel, causal, scale, group,
                               layout == "zigzag", comm, docs)

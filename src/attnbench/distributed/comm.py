"""The transfers the methods make, on NCCL directly and on gloo through host memory.

NCCL moves CUDA tensors itself. gloo moves host memory only (its send, recv and all-to-all take CPU
tensors), and gloo is what a job whose ranks share a GPU runs on, since NCCL refuses two ranks on one
device. So on gloo every tensor goes through a host copy: ``t.cpu()`` (no copy for a CPU tensor),
the transfer, and a copy back into the CUDA tensor once it has arrived. The copies are synchronous;
such a job checks results, it is not timed (``bench.run_case``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def through_host(group=None) -> bool:
    """True when ``group``'s backend moves host memory only (gloo)."""
    return dist.get_backend(group) == "gloo"


def _staged(t: torch.Tensor, group) -> bool:
    """True when ``t`` must go through a host copy to travel over ``group``."""
    return t.device.type != "cpu" and through_host(group)


class _CopyBack:
    """The requests of a staged transfer; ``wait`` also copies the host buffers into their targets."""

    def __init__(self, reqs: list, pairs: list[tuple[torch.Tensor, torch.Tensor]], keep: list[torch.Tensor]):
        self.reqs, self.pairs, self.keep = reqs, pairs, keep  # keep: host copies being sent

    def wait(self) -> None:
        for req in self.reqs:
            req.wait()
        for target, host in self.pairs:
            target.copy_(host)
        self.reqs, self.pairs, self.keep = [], [], []


def send_recv(tensors, next_peer: int, prev_peer: int, group=None) -> tuple[list[torch.Tensor], list]:
    """Send ``tensors`` to ``next_peer``, receive the same shapes from ``prev_peer``: (buffers, requests).

    The buffers hold the received tensors once every request has been waited for."""
    host = through_host(group)
    sends = [t.cpu() if host else t for t in tensors]
    recv = [torch.empty_like(t) for t in tensors]
    recv_wire = [torch.empty_like(s) if host and r.device.type != "cpu" else r for s, r in zip(sends, recv)]
    ops = [dist.P2POp(dist.isend, s, next_peer, group) for s in sends]
    ops += [dist.P2POp(dist.irecv, r, prev_peer, group) for r in recv_wire]
    reqs = dist.batch_isend_irecv(ops)
    pairs = [(r, w) for r, w in zip(recv, recv_wire) if r is not w]
    if not pairs:
        return recv, reqs
    return recv, [_CopyBack(reqs, pairs, sends)]


def all_to_all(recv: torch.Tensor, send: torch.Tensor, group=None) -> None:
    """``all_to_all_single`` of equal splits along dim 0, into ``recv``."""
    if _staged(send, group):
        wire = torch.empty_like(recv, device="cpu")
        dist.all_to_all_single(wire, send.cpu(), group=group)
        recv.copy_(wire)
        return
    dist.all_to_all_single(recv, send, group=group)


def all_gather(t: torch.Tensor, world: int, group=None) -> list[torch.Tensor]:
    """Every rank's ``t``, in rank order."""
    host = _staged(t, group)
    src = t.contiguous().cpu() if host else t.contiguous()
    parts = [torch.empty_like(src) for _ in range(world)]
    dist.all_gather(parts, src, group=group)
    return [p.to(t.device) for p in parts] if host else parts


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """In-place all-reduce of ``t``."""
    if _staged(t, group):
        wire = t.cpu()
        dist.all_reduce(wire, op=op, group=group)
        t.copy_(wire)
        return
    dist.all_reduce(t, op=op, group=group)

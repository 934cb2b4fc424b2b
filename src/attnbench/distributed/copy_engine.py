"""Ulysses' forward with its all-to-alls on the GPUs' copy engines instead of NCCL's kernels.

NCCL's all-to-all runs as a kernel: it takes SMs from the attention kernel it overlaps, and the pipelined forward
(``ulysses._pipelined_forward``) lost to that what it gained by hiding the transfers. Here each rank writes its
pieces straight into the other ranks' receive buffers with peer-to-peer memory copies (``cudaMemcpyAsync`` into
symmetric memory, ``torch.distributed._symmetric_memory``), which the copy engines carry over NVLink without any SM;
a barrier (a one-thread-block kernel that signals every peer and waits for their signals) after each chunk's copies
says that every rank's pieces of that chunk have landed. Forward only, without gradients, one GPU per rank, NVLink
(or PCIe) peer access between the GPUs. NVLink multicast is not used.

A call, with P head chunks per rank (P = 1: one exchange before the kernel, one after):

- compute stream: pack q, k, v as (rank, chunk, B, S/U, H/(U·P), D), so that each piece is one contiguous block;
- copy stream: barrier (every peer is done with the buffers of the previous call), then for each chunk c, the
  pieces of chunk c to every rank, and a barrier; chunk c's kernel waits for that barrier only, so chunk c + 1
  travels while chunk c computes;
- after chunk c's kernel: its output pieces to their ranks on the copy stream; a last barrier, then the output
  is unpacked into (B, S/U, H, D).

The buffers (the received q, k, v and output, each the size of the rank's own shard) are allocated and exchanged
once per shape and kept for the next call of that shape.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attnbench.distributed import timeline

_buffers: dict = {}


def missing() -> str | None:
    """Why this torch cannot run the copy-engine all-to-all (no symmetric memory), or None. CUDA and one GPU per
    rank are the method's own conditions, checked where it is built (``bench.build_method``)."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return f"ulysses-ce needs torch's symmetric memory, which this torch lacks ({exc})"
    return None


class _Buffers:
    """The receive buffers of one shape in symmetric memory, and every rank's view of them."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device, group):
        import torch.distributed._symmetric_memory as symm_mem

        self.local, self.handles = {}, {}
        for name, shape in shapes.items():
            t = symm_mem.empty(shape, dtype=dtype, device=device)
            self.local[name], self.handles[name] = t, symm_mem.rendezvous(t, group)
        self.rank, self.world = self.handles["q"].rank, self.handles["q"].world_size
        self.peers = {name: [h.get_buffer(j, shapes[name], dtype) for j in range(self.world)]
                      for name, h in self.handles.items()}
        self.stream = torch.cuda.Stream(device=device)

    def barrier(self) -> None:
        self.handles["q"].barrier(channel=0)


def _get(shapes, dtype, device, group) -> _Buffers:
    key = (tuple(sorted(shapes.items())), dtype, str(device), id(group))
    if key not in _buffers:
        _buffers.clear()  # one shape at a time: a sweep's longer sequences need the memory
        _buffers[key] = _Buffers(shapes, dtype, device, group)
    return _buffers[key]


def _pack(x: torch.Tensor, world: int, chunks: int) -> torch.Tensor:
    """(B, S/U, H, D) -> (U, P, B, S/U, H/(U·P), D), contiguous: [j, c] = chunk c of the heads rank j will hold."""
    b, s, h, d = x.shape
    return x.reshape(b, s, world, chunks, h // (world * chunks), d).permute(2, 3, 0, 1, 4, 5).contiguous()


def forward(q, k, v, *, kernel, causal: bool, scale: float, group, chunks: int = 1) -> torch.Tensor:
    """Ulysses attention of sequence shards q (B, S/U, Hq, D), k, v (B, S/U, Hkv, D), exchanged by copy engines."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    b, s, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    cq, ckv = hq // (world * chunks), hkv // (world * chunks)
    shapes = {"q": (chunks, world, b, s, cq, d), "k": (chunks, world, b, s, ckv, d),
              "v": (chunks, world, b, s, ckv, dv), "o": (chunks, world, b, s, cq, dv)}
    bufs = _get(shapes, q.dtype, q.device, group)
    me, compute, copier = bufs.rank, torch.cuda.current_stream(q.device), bufs.stream
    order = [(me + i) % world for i in range(world)]  # each rank starts with a different peer
    sends = {"q": _pack(q, world, chunks), "k": _pack(k, world, chunks), "v": _pack(v, world, chunks)}
    copier.wait_stream(compute)
    arrived = []
    with torch.cuda.stream(copier):
        bufs.barrier()  # every rank has finished reading the buffers of its previous call
        for c in range(chunks):
            for j in order:
                for name, send in sends.items():
                    bufs.peers[name][j][c, me].copy_(send[j, c])
            bufs.barrier()
            arrived.append(torch.cuda.Event())
            arrived[-1].record(copier)
    for t in sends.values():
        t.record_stream(copier)
    timeline.mark("a2a")  # the packing copies
    for c in range(chunks):
        compute.wait_event(arrived[c])
        timeline.mark("wait")
        qh, kh, vh = (bufs.local[n][c].transpose(0, 1).reshape(b, world * s, -1, bufs.local[n].shape[-1])
                      for n in ("q", "k", "v"))
        o = kernel.fwd(qh, kh, vh, causal, scale)[0]
        out = o.reshape(b, world, s, cq, dv).transpose(0, 1).contiguous()  # [j]: rank j's sequence
        copier.wait_stream(compute)
        with torch.cuda.stream(copier):
            for j in order:
                bufs.peers["o"][j][c, me].copy_(out[j])
        out.record_stream(copier)
        timeline.mark("kernel")
    with torch.cuda.stream(copier):
        bufs.barrier()
    compute.wait_stream(copier)
    # local "o": [c, j] = my sequence of rank j's heads, chunk c -> (B, S/U, U, P, H/(U·P), D), copied out of the
    # buffer the next call overwrites
    result = torch.empty(b, s, world, chunks, cq, dv, dtype=q.dtype, device=q.device)
    result.copy_(bufs.local["o"].permute(2, 3, 1, 0, 4, 5))
    timeline.mark("a2a")
    return result.reshape(b, s, hq, dv)

"""Ulysses' forward with its all-to-alls on the GPUs' copy engines instead of NCCL's kernels.

NCCL's all-to-all runs as a kernel: it takes SMs from the attention kernel it overlaps, and the pipelined forward
(``ulysses._pipelined_forward``) lost to that what it gained by hiding the transfers. Here each rank writes its
pieces straight into the other ranks' receive buffers in symmetric memory (``torch.distributed._symmetric_memory``)
with peer-to-peer 2-D memory copies (``cuMemcpy2DAsync``: one head slice of every token, a strided source or
destination), which the copy engines carry over NVLink without any SM; nothing is packed or unpacked on the SMs. A
barrier (a one-thread-block kernel that signals every peer and waits for their signals) after each chunk's copies
says that every rank's pieces of that chunk have landed. Forward only, without gradients, one GPU per rank, NVLink
(or PCIe) peer access between the GPUs. NVLink multicast is not used.

A call, with P head chunks per rank (P = 1: one exchange before the kernel, one after), U ranks, shards
(B, S/U, H, D):

- copy stream: barrier (every peer is done with the buffers of the previous call), then for each chunk c, rank j's
  heads of chunk c of my S/U tokens into rows [me·S/U, (me + 1)·S/U) of rank j's receive buffer (P, B, S, H/(U·P),
  D), and a barrier; chunk c's kernel reads its buffer in place and waits for that barrier only, so chunk c + 1
  travels while chunk c computes;
- after chunk c's kernel: rows [j·S/U, (j + 1)·S/U) of its output into rank j's output buffer (B, S/U, H, D), at
  my heads of chunk c; a last barrier, and the output is copied out of the buffer the next call overwrites.

The buffers (the received q, k, v and output, each the size of the rank's own shard) are allocated and exchanged
once per shape and kept for the next call of that shape.
"""

from __future__ import annotations

import ctypes
import functools

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


class _Copy2D(ctypes.Structure):
    """The CUDA driver's CUDA_MEMCPY2D (cuda.h), device to device only."""

    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int),
                ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
                ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


_DEVICE = 2  # CU_MEMORYTYPE_DEVICE


@functools.cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpy2DAsync_v2.argtypes = [ctypes.POINTER(_Copy2D), ctypes.c_void_p]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _pitch(x: torch.Tensor) -> int:
    """The bytes between rows of a (rows, heads, d) view whose rows are each one dense block."""
    if x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.size(2):
        raise ValueError(f"a 2-D copy needs dense rows, not shape {tuple(x.shape)} strides {x.stride()}")
    return x.stride(0) * x.element_size()


def copy_rows(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """dst <- src for (rows, heads, d) views with dense rows and any row stride, as one 2-D copy on ``stream``
    (``cuMemcpy2DAsync``: the copy engines, also between GPUs with peer access)."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"2-D copy of {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)} {dst.dtype}")
    p = _Copy2D(srcMemoryType=_DEVICE, srcDevice=src.data_ptr(), srcPitch=_pitch(src),
                dstMemoryType=_DEVICE, dstDevice=dst.data_ptr(), dstPitch=_pitch(dst),
                WidthInBytes=src.size(1) * src.size(2) * src.element_size(), Height=src.size(0))
    lib = _driver()
    if rc := lib.cuMemcpy2DAsync_v2(ctypes.byref(p), ctypes.c_void_p(stream.cuda_stream)):
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"cuMemcpy2DAsync failed: {(name.value or b'CUresult %d' % rc).decode()}")


def forward(q, k, v, *, kernel, causal: bool, scale: float, group, chunks: int = 1) -> torch.Tensor:
    """Ulysses attention of sequence shards q (B, S/U, Hq, D), k, v (B, S/U, Hkv, D), exchanged by copy engines."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    q, k, v = (x.contiguous() for x in (q, k, v))
    b, s, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    cq, ckv = hq // (world * chunks), hkv // (world * chunks)
    shapes = {"q": (chunks, b, world * s, cq, d), "k": (chunks, b, world * s, ckv, d),
              "v": (chunks, b, world * s, ckv, dv), "o": (b, s, hq, dv)}
    bufs = _get(shapes, q.dtype, q.device, group)
    me, compute, copier = bufs.rank, torch.cuda.current_stream(q.device), bufs.stream
    order = [(me + i) % world for i in range(world)]  # each rank starts with a different peer
    mine = slice(me * s, (me + 1) * s)  # my tokens' rows in every rank's receive buffers
    copier.wait_stream(compute)
    arrived = []
    with torch.cuda.stream(copier):
        bufs.barrier()  # every rank has finished reading the buffers of its previous call
        for c in range(chunks):
            for j in order:
                for name, x, h in (("q", q, cq), ("k", k, ckv), ("v", v, ckv)):
                    first = (j * chunks + c) * h  # rank j's heads of chunk c
                    for i in range(b):
                        copy_rows(bufs.peers[name][j][c, i, mine], x[i, :, first:first + h], copier)
            bufs.barrier()
            arrived.append(torch.cuda.Event())
            arrived[-1].record(copier)
    for x in (q, k, v):
        x.record_stream(copier)
    timeline.mark("a2a")
    for c in range(chunks):
        compute.wait_event(arrived[c])
        timeline.mark("wait")
        o = kernel.fwd(bufs.local["q"][c], bufs.local["k"][c], bufs.local["v"][c], causal, scale)[0].contiguous()
        copier.wait_stream(compute)
        first = (me * chunks + c) * cq  # my heads of chunk c in every rank's output
        with torch.cuda.stream(copier):
            for j in order:
                for i in range(b):
                    copy_rows(bufs.peers["o"][j][i, :, first:first + cq], o[i, j * s:(j + 1) * s], copier)
        o.record_stream(copier)
        timeline.mark("kernel")
    with torch.cuda.stream(copier):
        bufs.barrier()
    compute.wait_stream(copier)
    result = bufs.local["o"].clone()  # out of the buffer the next call overwrites
    timeline.mark("a2a")
    return result

"""Peer bandwidth and latency between the ranks of a job, for the transfers context-parallel attention makes
(``attnbench links``).

Three transfers, each at message sizes from a few KiB to the largest K/V or dK/dV block a method sends:

- ``p2p``: every rank sends ``size`` bytes to the next rank and receives as many from the previous one with
  one ``batch_isend_irecv``, as a ring step does (``comm.send_recv``); bytes counted per direction per GPU;
- ``a2a``: ``all_to_all_single`` of a ``size``-byte tensor per rank, as Ulysses' swaps; counted as the
  (N-1)/N of it that crosses the link, the model's convention;
- ``copy``: a device-to-device copy from GPU 0 to GPU 1 by one process (the copy engines over the link,
  no NCCL), when rank 0 sees two or more GPUs.

Each size is timed with CUDA events around one transfer and a stream wait for it, ``repeat`` times after a
warm-up, on every rank; a sample is the slowest rank's. The fit per transfer: latency = the median time of
the smallest message, bandwidth = bytes / (time - latency) of the largest (both from measurements, no
regression that a single odd point could bend). A bandwidth is held to the device's memory bandwidth
(``bandwidth_problem``), as kernel times are to its peaks (``plausibility``): a row above it is marked
``implausible`` and a fit above it, or one with nothing to read off, is reported as not made.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from attnbench import plausibility
from attnbench.distributed import comm as xfer
from attnbench.distributed.bench import max_over_ranks
from attnbench.timing import peaks

KINDS = ("p2p", "a2a", "copy")
DEFAULT_SIZES = tuple(2**e for e in range(12, 33, 2))  # 4 KiB .. 4 GiB


def _timed(op, repeat: int, warmup: int, device: torch.device) -> list[float]:
    """ms per call of ``op`` (which returns the requests to wait for), each call bracketed by CUDA events
    (``perf_counter`` on CPU, where gloo moves host memory: what the tests run)."""
    samples = []
    for i in range(warmup + repeat):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        for req in op() or []:
            req.wait()
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize(device)
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            samples.append(ms)
    return samples


def measure(device: torch.device, sizes=DEFAULT_SIZES, repeat: int = 10, warmup: int = 3) -> list[dict]:
    """Rows of {kind, bytes, counted_bytes, median_ms, p10_ms, p90_ms, gbs} (complete on rank 0)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError("links needs two or more ranks (torchrun --nproc_per_node 2 or more)")
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    rows = []
    for size in sizes:
        rows += _measure_size(size, device, nxt, prev, world, repeat, warmup)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _measure_size(size: int, device: torch.device, nxt: int, prev: int, world: int, repeat: int,
                  warmup: int) -> list[dict]:
    n = size // 2  # bf16 elements
    send = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    a2a_out = torch.empty(n - n % world, dtype=torch.bfloat16, device=device)
    ops = {"p2p": (lambda: xfer.send_recv([send], nxt, prev)[1], size),
           "a2a": (lambda: xfer.all_to_all(a2a_out, send[: a2a_out.numel()]), size * (world - 1) / world)}
    rows = [_row(kind, size, counted, max_over_ranks(_timed(op, repeat, warmup, device)))
            for kind, (op, counted) in ops.items()]
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    copy = _peer_copy(send, device, repeat, warmup) if gpus > 1 else None
    if copy:
        rows.append(_row("copy", size, size, copy))
    return rows


def _peer_copy(send: torch.Tensor, device: torch.device, repeat: int, warmup: int) -> list[float] | None:
    """Rank 0 copies ``send`` to the next GPU with the copy engines; the other ranks wait (None)."""
    if dist.get_rank() != 0:
        dist.barrier()
        return None
    other = torch.device("cuda", (device.index + 1) % torch.cuda.device_count())
    target = torch.empty_like(send, device=other)
    samples = []
    for i in range(warmup + repeat):
        torch.cuda.synchronize(device)
        torch.cuda.synchronize(other)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(send, non_blocking=True)
        end.record()
        torch.cuda.synchronize(device)
        torch.cuda.synchronize(other)
        if i >= warmup:
            samples.append(start.elapsed_time(end))
    dist.barrier()
    return samples


def _row(kind: str, size: int, counted: float, samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    med = statistics.median(samples)
    return {"kind": kind, "bytes": size, "counted_bytes": counted, "median_ms": med, "p10_ms": q[0],
            "p90_ms": q[-1], "gbs": counted / (med * 1e-3) / 1e9 if med > 0 else None}


def mark_implausible(rows: list[dict], limits: plausibility.Ceilings) -> list[dict]:
    """Each row whose bandwidth cannot be real gets ``implausible`` (the reason) and no ``gbs``."""
    for r in rows:
        why = bandwidth_problem(r["gbs"], limits) if r["gbs"] is not None else "a time of 0 ms: below the timer"
        if why:
            r["implausible"], r["gbs"] = why, None
    return rows


def ceiling_for(device: str | torch.device) -> plausibility.Ceilings:
    """The memory bandwidth no transfer of ``device`` can beat: a device (``cuda:0``, ``cpu``) is asked
    directly; a GPU's name (a links file's ``device``) gets its datasheet's, else the unknown-GPU ceiling."""
    if isinstance(device, torch.device) or str(device).split(":")[0] in ("cpu", "cuda"):
        return plausibility.ceilings(device)
    sheet = peaks.datasheet(str(device))
    if sheet.get("copy"):
        return plausibility.Ceilings(plausibility.UNKNOWN_GPU_TFLOPS, sheet["copy"], f"{device}: datasheet")
    return plausibility.Ceilings(plausibility.UNKNOWN_GPU_TFLOPS, plausibility.UNKNOWN_GPU_GBPS,
                                 f"{device or 'an unnamed device'}: no known peak")


def bandwidth_problem(gbs: float, limits: plausibility.Ceilings) -> str | None:
    """Why a link bandwidth (GB/s per direction per GPU) cannot be real, or None: it is not a positive finite
    number, or it is above the device's memory bandwidth (a link cannot send faster than the memory it reads
    from and writes to), with the margin kernel times get (``plausibility.MARGIN``)."""
    if not (isinstance(gbs, (int, float)) and math.isfinite(gbs) and gbs > 0):
        return f"a bandwidth of {gbs!r} GB/s is not a positive finite number"
    if gbs > plausibility.MARGIN * limits.gbps:
        return (f"{gbs:,.0f} GB/s is above the device's memory bandwidth, {limits.gbps:,.0f} GB/s ({limits.source}): "
                "not a measurement of a link")
    return None


def fit(rows: list[dict], limits: plausibility.Ceilings | None = None) -> dict[str, dict]:
    """{kind: {latency_us, gbs, from_bytes, to_bytes}}: latency from the smallest message, bandwidth from the
    largest with that latency taken off. When no bandwidth can be read off (fewer than two sizes, the largest
    message no slower than the smallest, a result above ``limits``' memory bandwidth) ``gbs`` is None and
    ``unfitted`` says why: a number is never made up."""
    out = {}
    for kind in KINDS:
        pts = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["bytes"])
        if not pts:
            continue
        lat_ms, big = pts[0]["median_ms"], pts[-1]
        entry = {"latency_us": lat_ms * 1e3, "gbs": None, "from_bytes": pts[0]["bytes"], "to_bytes": big["bytes"]}
        extra_ms = big["median_ms"] - lat_ms
        if len(pts) < 2:
            entry["unfitted"] = "one message size measured: a bandwidth needs two (raise --max-mib)"
        elif not extra_ms > 0:
            entry["unfitted"] = (f"the largest message ({big['bytes']:,.0f} B, {big['median_ms']:.4g} ms) took no longer "
                                 f"than the smallest ({pts[0]['bytes']:,.0f} B, {lat_ms:.4g} ms)")
        else:
            gbs = big["counted_bytes"] / (extra_ms * 1e-3) / 1e9
            why = bandwidth_problem(gbs, limits) if limits is not None else None
            if why:
                entry["unfitted"] = why
            else:
                entry["gbs"] = gbs
        out[kind] = entry
    return out

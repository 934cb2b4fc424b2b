"""Is a measured time physically possible? A timed case whose throughput exceeds what the device can do
is recorded with status ``implausible`` and the reason, never as a speed.

The ceilings, per device:

- **compute**: the larger of the datasheet's dense bf16/fp16 tensor-core peak (``peaks.DATASHEET``) and
  the peak ``attnbench calibrate`` measured; quantized kernels (approximate backends, int8/fp8 inside)
  get twice that. A sparse kernel that reports the fraction of blocks it skipped (``info["sparsity"]``)
  is held to the FLOPs of the blocks it kept.
- **memory**: the datasheet's (or measured) DRAM bandwidth, applied to the minimal bytes of the call
  (``metrics.bytes_moved``) only when the L2 is flushed before every call (a warm L2 serves repeats
  from cache) and not to sparse kernels (they may skip key blocks).
- a GPU with neither a datasheet entry nor a calibration: 5,000 TFLOP/s and 10,000 GB/s, above any
  current GPU (so only the impossible is flagged).
- **CPU**: a deliberately generous 10 TFLOP/s and 1,000 GB/s per core (a 2048-FLOP/cycle matrix unit at
  5 GHz; an L1 cache's bandwidth), since no CPU datasheet is known here.

A case is implausible when its throughput is more than ``MARGIN`` above a ceiling, or when its calls left
work running on the device after the timed stream was done (``timing.streams``: work on a stream the
caller's stream does not wait for, which no time taken on the caller's stream contains).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from attnbench.timing import peaks, streams

MARGIN = 1.05
"""Allowed excess over a ceiling (clock boost above the datasheet's, timer resolution)."""
UNKNOWN_GPU_TFLOPS, UNKNOWN_GPU_GBPS = 5000.0, 10000.0
CPU_TFLOPS_PER_CORE, CPU_GBPS_PER_CORE = 10.0, 1000.0
QUANTIZED_FACTOR = 2.0


@dataclass(frozen=True)
class Ceilings:
    """What the device can do at most: dense TFLOP/s and DRAM GB/s, and where the numbers come from."""

    tflops: float
    gbps: float
    source: str


def ceilings(device: str | torch.device, measured: dict[str, float] | None = None) -> Ceilings:
    """Ceilings of ``device``; ``measured`` = {"bf16"/"fp16": TFLOP/s, "copy": GB/s} from calibrate, if any."""
    import torch

    device = torch.device(device)
    measured = measured or {}
    if device.type != "cuda":
        cores = os.cpu_count() or 1
        return Ceilings(CPU_TFLOPS_PER_CORE * cores, CPU_GBPS_PER_CORE * cores,
                        f"generous CPU ceiling for {cores} cores")
    name = torch.cuda.get_device_name(device)
    sheet = peaks.datasheet(name)
    compute = [v for v in (sheet.get("matmul_bf16"), sheet.get("matmul_fp16"), measured.get("bf16"),
                           measured.get("fp16")) if v]
    bandwidth = [v for v in (sheet.get("copy"), measured.get("copy")) if v]
    source = " and ".join(x for x, ok in (("datasheet", sheet), ("calibrate", measured)) if ok) or "no known peak"
    return Ceilings(max(compute, default=UNKNOWN_GPU_TFLOPS), max(bandwidth, default=UNKNOWN_GPU_GBPS),
                    f"{name}: {source}")


def check(*, tflops: float | None, gbps: float | None, info: dict, exact: bool, cold_l2: bool,
          limits: Ceilings) -> str | None:
    """Why the measured time is not the kernel's (work left running off the timed stream) or its throughput is
    impossible on the device, or None."""
    off_stream = streams.reason(info)
    if off_stream:
        return off_stream
    sparsity = info.get("sparsity")
    kept = 1.0 - sparsity if isinstance(sparsity, (int, float)) and 0 <= sparsity < 1 else 1.0
    compute = limits.tflops * (1.0 if exact else QUANTIZED_FACTOR)
    if tflops is not None and tflops * kept > MARGIN * compute:
        done = f"{tflops * kept:,.0f} TFLOP/s" + (f" ({kept:.0%} of the blocks kept)" if kept < 1 else "")
        return f"{done} is above the device's {compute:,.0f} TFLOP/s ({limits.source})"
    if gbps is not None and cold_l2 and kept == 1.0 and gbps > MARGIN * limits.gbps:
        return (f"{gbps:,.0f} GB/s of inputs and outputs is above the device's {limits.gbps:,.0f} GB/s "
                f"({limits.source})")
    return None

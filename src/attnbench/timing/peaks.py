"""Measured peaks of this device (`attnbench calibrate`) and datasheet peaks to show beside them.

Measured: dense matmul throughput (square ``torch.matmul`` in bf16 and fp16, TFLOP/s = 2 n^3 / time)
and device copy bandwidth (a large device-to-device copy, counting bytes read + written, GB/s), and read
bandwidth (a sum over a large buffer, bytes read, GB/s: what a decode step, which reads its KV cache and writes
almost nothing, is held to).
Medians of event-timed calls on GPU, of perf_counter-timed calls on CPU (small sizes there).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# (lower-case name fragment, dense bf16 TFLOP/s, dense fp16 TFLOP/s, memory GB/s); first match wins,
# so the more specific names come first. Dense = no structured sparsity.
DATASHEET = (
    ("h100 pcie", 756.0, 756.0, 2000.0),
    ("h200", 989.0, 989.0, 4800.0),
    ("h100", 989.0, 989.0, 3350.0),
    ("a100", 312.0, 312.0, 2000.0),
    ("rtx 4090", 165.0, 165.0, 1010.0),  # fp16/bf16 with fp32 accumulation
    ("mi210", 181.0, 181.0, 1600.0),
    ("mi300x", 1307.0, 1307.0, 5300.0),
)
KINDS = {"matmul_bf16": "TFLOP/s", "matmul_fp16": "TFLOP/s", "copy": "GB/s", "read": "GB/s"}
GPU_MATMUL_N, CPU_MATMUL_N = 8192, 128
GPU_COPY_BYTES, CPU_COPY_BYTES = 2 * 1024**3, 16 * 1024**2


def datasheet(device_name: str) -> dict[str, float]:
    """Datasheet peaks {kind: value} for a known GPU name, {} for an unknown one."""
    name = device_name.lower()
    for fragment, bf16, fp16, gbps in DATASHEET:
        if fragment in name:
            return {"matmul_bf16": bf16, "matmul_fp16": fp16, "copy": gbps, "read": gbps}
    return {}


def _median_ms(fn, device: torch.device, warmup: int, repeat: int) -> float:
    from attnbench.timing import TimingConfig, measure
    config = TimingConfig(warmup=warmup, repeat=repeat, cold_l2=False, min_time_ms=0.0)
    return statistics.median(measure(fn, config, device))


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, *, warmup: int = 5, repeat: int = 20) -> float:
    """TFLOP/s of an n x n x n ``torch.matmul`` in ``dtype`` (median call)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    ms = _median_ms(lambda: torch.matmul(a, b, out=out), device, warmup, repeat)
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def copy_gbps(device: torch.device, nbytes: int, *, warmup: int = 3, repeat: int = 20) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (bytes read + written, median call)."""
    import torch

    src = torch.ones(max(1, nbytes // 4), device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), device, warmup, repeat)
    return 2.0 * src.numel() * 4 / (ms * 1e-3) / 1e9


def calibrate(device: str | torch.device, *, matmul_n: int | None = None, copy_bytes: int | None = None,
              repeat: int | None = None) -> dict:
    """Measure every kind in KINDS on ``device``: {"measured": {kind: value}, "details": {...}}."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    n = matmul_n or (GPU_MATMUL_N if cuda else CPU_MATMUL_N)
    nbytes = copy_bytes or (GPU_COPY_BYTES if cuda else CPU_COPY_BYTES)
    repeat = repeat or (20 if cuda else 5)
    if cuda:
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(nbytes, free // 4)
    warmup = 5 if cuda else 1
    measured = {"matmul_bf16": matmul_tflops(device, torch.bfloat16, n, warmup=warmup, repeat=repeat),
                "matmul_fp16": matmul_tflops(device, torch.float16, n, warmup=warmup, repeat=repeat),
                "copy": copy_gbps(device, nbytes, warmup=warmup, repeat=repeat),
                "read": read_gbps(device, nbytes, warmup=warmup, repeat=repeat)}
    timer = "cuda events" if cuda else "perf_counter"
    return {"measured": measured, "details": {"matmul_n": n, "copy_bytes": int(nbytes), "repeat": repeat,
                                              "timer": timer, "statistic": "median"}}


def read_gbps(device: torch.device, nbytes: int, *, warmup: int = 3, repeat: int = 20) -> float:
    """GB/s of reading ``nbytes`` once (a sum into one number: bytes read, median call)."""
    import torch

    src = torch.ones(max(1, nbytes // 4), device=device, dtype=torch.float32)
    out = torch.empty((), device=device, dtype=torch.float32)
    ms = _median_ms(lambda: torch.sum(src, dim=0, out=out), device, warmup, repeat)
    return src.numel() * 4 / (ms * 1e-3) / 1e9


def measured_peaks(db, device, *, copy: bool = False) -> dict[str, float]:
    """{dtype: measured matmul TFLOP/s} stored for ``device``'s name in the results file ``db`` (and
    "copy": GB/s with ``copy``)."""
    from pathlib import Path

    from attnbench.results.env import device_name
    from attnbench.results.store import ResultStore
    if not Path(db).exists():
        return {}
    with ResultStore(db, readonly=True) as store:
        stored = store.peaks(device_name(device))
    kinds = {"bf16": "matmul_bf16", "fp16": "matmul_fp16", **({"copy": "copy"} if copy else {})}
    return {key: float(stored[kind]["value"]) for key, kind in kinds.items() if kind in stored}

"""Kernel-only timing from torch.profiler, and Chrome/Perfetto traces of a case.

``time_profiler`` profiles ``repeat`` calls launched as a marked sequence (see ``marked.py``): each
sample is the sum of the durations of the device kernels (and memsets/copies) of one call, with
launch gaps and the L2 flush excluded, and the record gets the names of the kernels that ran.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.timing.events import L2Flusher
from attnbench.timing.marked import (
    Kernel,
    Marker,
    iteration_times_ms,
    kernel_names,
    kernel_times_ms,
    launch_marked,
    split_marked,
)


def device_kernels(events) -> list[Kernel]:
    """(name, ms) of the device activities in a profile, in the order they ran on the device."""
    from torch.autograd import DeviceType
    picked = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    picked.sort(key=lambda e: e.time_range.start)
    return [(e.name, (e.time_range.end - e.time_range.start) / 1e3) for e in picked]


def time_profiler(fn: Callable[[], object], *, warmup: int, repeat: int, cold_l2: bool,
                  device: torch.device) -> tuple[list[float], dict]:
    """Per-call device kernel time (ms) of ``repeat`` calls, and info naming the kernels."""
    from torch.profiler import ProfilerActivity, profile
    flush = L2Flusher(device) if cold_l2 else None
    marker = Marker(device)
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            launch_marked(fn, repeat, marker, flush)
            torch.cuda.synchronize(device)
    iterations = split_marked(device_kernels(prof.events()), [repeat], cold=flush is not None)[0]
    samples = iteration_times_ms(iterations)
    per_call = [len(it) for it in iterations]
    info = {"kernels": kernel_names(iterations), "kernel_ms": kernel_times_ms(iterations),
            "kernels_per_call": int(statistics.median(per_call)),
            "kernel_source": "torch.profiler"}
    return samples, info


def export_trace(fn: Callable[[], object], path: str | Path, device: torch.device, calls: int = 3) -> Path:
    """Write a Chrome/Perfetto trace (JSON) of ``calls`` calls of ``fn``; works on CPU and GPU."""
    from torch.profiler import ProfilerActivity, profile, record_function
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()  # one untimed call so lazy initialisation does not fill the trace
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for i in range(calls):
            with record_function(f"attnbench_call_{i}"):
                fn()
        if cuda:
            torch.cuda.synchronize(device)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path

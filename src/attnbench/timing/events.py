"""GPU timing with CUDA events (also HIP events on ROCm builds of torch), optionally with a cold L2.

Each timed call is bracketed by its own pair of events, so host-side gaps between calls are not
counted. With ``cold_l2`` a buffer twice the size of the L2 cache (read from the device properties)
is overwritten before each call, outside the event pair, so inputs are read from device memory as
they would be in a real model step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FALLBACK_L2_BYTES = 128 * 1024 * 1024


def l2_bytes(device: torch.device) -> int:
    """L2 cache size of the device in bytes (a generous fallback if torch does not report it)."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or FALLBACK_L2_BYTES)


class L2Flusher:
    """Owns a buffer >= 2x L2 and overwrites it on demand (on the current stream)."""

    def __init__(self, device: torch.device):
        self.buffer = torch.empty(2 * l2_bytes(device) // 4 + 1, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def __call__(self) -> None:
        self.buffer.zero_()


def _timed_batch(fn: Callable[[], object], count: int, flush: L2Flusher | None,
                 device: torch.device) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def time_events(fn: Callable[[], object], *, warmup: int, repeat: int, cold_l2: bool,
                device: torch.device, min_time_ms: float = 0.0, max_repeat: int | None = None) -> list[float]:
    """Milliseconds per call of ``fn`` after ``warmup`` calls, one event pair per call.

    At least ``repeat`` samples; more until they add up to ``min_time_ms`` (at most ``max_repeat``).
    """
    from attnbench.timing.config import TimingConfig
    policy = TimingConfig(repeat=repeat, min_time_ms=min_time_ms, max_repeat=max(max_repeat or repeat, repeat))
    flush = L2Flusher(device) if cold_l2 else None
    samples: list[float] = []
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        while (count := policy.samples_wanted(samples, "cuda")) > 0:
            samples += _timed_batch(fn, count, flush, device)
    return samples

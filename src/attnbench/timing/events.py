"""GPU timing with CUDA events (also HIP events on ROCm builds of torch), optionally with a cold L2.

Each timed call is bracketed by its own pair of events. With ``cold_l2`` a buffer twice the size of
the L2 cache is overwritten before each call, so inputs come from device memory as in a real model
step.

Launch-ahead: when the host needs longer to launch a call than the device needs to run it (small
kernels, Python-heavy wrappers), the device would idle between the start event and the kernel and
that host time would be counted as kernel time. So before each chunk of calls the device is held by
a spin kernel (``torch.cuda._sleep``) long enough for the host to queue the whole chunk; the device
then runs flush, start, call, end back to back and the events see device time only.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

from attnbench.timing.config import TimingConfig

FALLBACK_L2_BYTES = 128 * 1024 * 1024
MAX_HOLD_MS = 50.0  # longest spin before a chunk; chunks are sized to fit in it
HOLD_MARGIN = 1.25
"""The spin before a chunk covers this many times the host's measured time to queue it (jitter margin)."""


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


@functools.cache
def _spin_cycles_per_ms(device_index: int) -> float | None:
    """Cycles of ``torch.cuda._sleep`` per millisecond on this device (None if it is unavailable)."""
    if not hasattr(torch.cuda, "_sleep"):
        return None
    with torch.cuda.device(device_index):
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # warm the kernel up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
    return cycles / ms if ms > 0 else None


def _hold_device(device: torch.device, ms: float) -> None:
    rate = _spin_cycles_per_ms(device.index if device.index is not None else torch.cuda.current_device())
    if rate and ms > 0:
        torch.cuda._sleep(int(rate * ms))


def hold_ms(calls: int, host_ms_per_call: float, device_ms_per_call: float) -> float:
    """Spin long enough that the device reaches none of ``calls`` before the host has queued it: the
    host needs ``calls * host`` ms, the device reaches call i after the spin and i earlier calls."""
    return max(0.0, HOLD_MARGIN * host_ms_per_call * calls - device_ms_per_call * (calls - 1))


def _timed_batch(fn: Callable[[], object], count: int, flush: L2Flusher | None, device: torch.device,
                 host_ms_per_call: float, device_ms_per_call: float = 0.0, idle_ms: float = 0.0,
                 align: Callable[[], object] | None = None) -> list[float]:
    """``count`` calls, each between its own event pair, queued ahead in chunks (see module doc).
    ``device_ms_per_call``: a lower bound of the device time per call (shortens the spin); ``idle_ms``:
    the device idles (spins) this long before each call; ``align``: queued right before each start event."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    chunk = max(1, min(count, int(MAX_HOLD_MS / host_ms_per_call)))
    for first in range(0, count, chunk):
        pairs = list(zip(starts[first:first + chunk], ends[first:first + chunk]))
        _hold_device(device, hold_ms(len(pairs), host_ms_per_call, device_ms_per_call + idle_ms))
        for start, end in pairs:
            if flush is not None:
                flush()
            if idle_ms > 0:
                _hold_device(device, idle_ms)
            if align is not None:
                align()
            start.record()
            fn()
            end.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_events(fn: Callable[[], object], config: TimingConfig, device: torch.device,
                align: Callable[[], object] | None = None) -> list[float]:
    """Milliseconds per call of ``fn`` (``time_events_detailed``'s samples)."""
    return time_events_detailed(fn, config, device, align)[0]


def launch_info(host_call_ms: list[float], samples_ms: list[float]) -> dict:
    """What the host paid to issue one call against what the device spent on it: ``host_ms`` is the median host
    time of the later warm-up calls (queued without waiting, so the launch and the Python around it, L2 flush
    excluded), ``host_bound`` whether it exceeds the median device time: in a loop without the launch-ahead
    spin such a call runs at the host's pace, and its number here is the kernel's alone."""
    host = statistics.median(host_call_ms[len(host_call_ms) // 2:])
    device = statistics.median(samples_ms)
    return {"host_ms": round(host, 5), "host_bound": host > device}


def time_events_detailed(fn: Callable[[], object], config: TimingConfig, device: torch.device,
                         align: Callable[[], object] | None = None) -> tuple[list[float], dict]:
    """Milliseconds per call of ``fn`` after ``config.warmup`` calls, one event pair per call, the L2
    flushed before each call when ``config.cold_l2``; and what the timing saw beside them: ``timed_s``, the
    ``time.perf_counter`` seconds the timed calls began and ended (warm-up excluded: the window over which
    ``clocks.WindowSampler`` readings describe them), and ``launch`` (``launch_info``).

    ``align``, for processes whose calls meet each other (the ranks of a distributed job): it queues, on
    the current stream, a wait until every process's device has reached the same point (a collective),
    and it is queued right before each start event. Without it each device starts a call when its own
    spin ends; spins are timed in clock cycles from each process's own estimate of its host time, so
    the ranks' devices leave them at different moments, and a rank that starts later makes the others
    wait inside their timed calls: that wait would be counted as their time (seen on two H200s: one
    rank's samples at 2x the other's).

    As many samples as ``config``'s sampling policy asks for (``TimingConfig.samples_wanted``): at least
    ``repeat``, more until ``min_time_ms`` is measured, fewer (never under MIN_SAMPLES) once the samples
    or the wall time spent sampling reach the time cap. The warm-up stops early when its first call
    shows the rest would take over a quarter of that cap.
    """
    flush = L2Flusher(device) if config.cold_l2 else None
    samples: list[float] = []
    with torch.cuda.device(device):
        host_ms, call_ms = [], []

        def warm_call() -> None:
            t0 = time.perf_counter()
            if flush is not None:
                flush()
            t1 = time.perf_counter()
            fn()
            t2 = time.perf_counter()
            host_ms.append((t2 - t0) * 1e3)
            call_ms.append((t2 - t1) * 1e3)

        t0 = time.perf_counter()
        warm_call()
        torch.cuda.synchronize(device)
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(config.warmup_calls(first_ms, "cuda")):
            warm_call()
        torch.cuda.synchronize(device)
        # Host cost of queueing one call (the later warm-up calls: no compilation, no allocator growth).
        per_call = statistics.median(host_ms[len(host_ms) // 2:]) + 0.01
        start = time.perf_counter()
        while (count := config.samples_wanted(samples, "cuda", (time.perf_counter() - start) * 1e3)) > 0:
            # the device time of a call, once samples show it (the fastest one: a lower bound)
            device_ms = min(samples) if samples else 0.0
            idle = config.idle_ratio * (statistics.median(samples) if samples else first_ms)
            samples += _timed_batch(fn, count, flush, device, per_call, device_ms, idle, align)
        end = time.perf_counter()
    return samples, {"timed_s": [start, end], "launch": launch_info(call_ms, samples)}

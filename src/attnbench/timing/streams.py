"""Work the timed stream does not wait for: a kernel that launches its work on another stream.

Events (and the torch profiler's per-call grouping, and CUDA graph capture) time what is queued on the
current stream. A closure that enqueues its kernels on a stream of its own and returns without making the
current stream wait for them finishes "instantly" on those events while the device is still busy: its
record would show the time of the launches. The caller's next kernel would also read its outputs before
they are written, so such a kernel is wrong to use as it is, whatever its speed.

**The check.** After a case is timed on a GPU (every in-process mode), one batch of ``N`` calls is timed twice
over, by the current stream and by the whole device::

    synchronize the device; record event e0; wait for e0; t0 = clock
    N calls
    record event e1; synchronize the device; t1 = clock

``stream_ms`` is e0 to e1: when the current stream had done its part. ``wall_ms`` is t0 to t1: when every
stream of the device had (``torch.cuda.synchronize`` waits for all of them). The clock starts once e0 has run,
not when it was queued: on a GPU shared with other processes e0 may wait for their time slice, and that wait is
not work outside the timed stream (counted from the queueing, a few ms of it would mark a 10 ms batch). Work the
current stream waits for ends before e1, so for a well-behaved kernel ``outside_ms = wall_ms - stream_ms`` is the
latency of a launch and of a synchronize: 0.01-0.06 ms on an H200 (2026-11-28: four 4096² bf16 matmuls a call on the
current stream or on a side stream joined back, and a 16-element add; 0.3% of a 16 ms batch). The same
matmuls left on a side stream: 15 of 16 ms outside, and 101 of 158 ms in a 200-call batch (there the host's
launches block once the device's launch queue is full, so the current stream's events follow the side
stream's progress; what is left in the queue at the end still shows). The rule: the calls **left work
running outside the timed stream** when

    outside_ms > max(OUTSIDE_MIN_MS, OUTSIDE_SHARE * wall_ms)

more than a quarter of the batch's wall time, and at least 1 ms, came after the current stream was done.
A batch that says so is timed once more, and the case is marked only when both do (the host thread
switched out between e1 and the synchronize's return counts as outside time once, not twice); the smaller
of the two is recorded. The record keeps the numbers in ``info["off_stream"]`` and, when marked,
``plausibility.check`` gives the case status ``implausible`` with the reason: its time is kept, no speed is
derived from it, and ``run`` fails (the views show it as they show any implausible case).

``N``: enough calls for about ``BATCH_MS`` at the case's measured median, at least 1 and at most
``MAX_CALLS``. So the check costs one batch a case: about 10 ms; ``MAX_CALLS`` launches for a kernel faster
than its launch (20 ms at 100 us a launch); a single call for a case of more than 10 ms. Beside the 100-150 ms
(and at least ten calls) of sampling, that is under a tenth of the timing. A marked case pays for a second
batch.

**What it does not see.** Work on another stream that is done before the host has launched the next call:
the host's own time per call hides it (the events then time little or nothing, which the throughput
ceilings of ``plausibility`` catch for any real amount of work). The profiler modes (``--profiler
torch``, ncu, nsys) time the kernels of every stream; this check still runs with ``--profiler torch``,
since the caller's stream is not ordered after the work whatever the profiler measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the views read ``reason`` without torch
    import torch

OUTSIDE_SHARE = 0.25
"""Share of a batch's wall time that may pass after the current stream is done before the case is marked."""
OUTSIDE_MIN_MS = 1.0
"""... and at least this many ms of it (a short batch's synchronize latency and scheduler jitter)."""
BATCH_MS = 10.0
"""Calls in the batch: about this many ms of them at the measured median."""
MAX_CALLS = 200
"""Most calls in a batch (a kernel timed at microseconds; its host launches set the batch's length)."""

Batch = Callable[[Callable[[], object], int, "torch.device"], tuple[float, float]]
"""(fn, calls, device) -> (wall_ms, stream_ms) of one batch."""


def calls_for(median_ms: float) -> int:
    """Calls in the batch of a case whose median call took ``median_ms``."""
    if not median_ms > 0 or not math.isfinite(median_ms):
        return MAX_CALLS
    return max(1, min(MAX_CALLS, math.ceil(BATCH_MS / median_ms)))


def outside(wall_ms: float, stream_ms: float) -> float:
    """ms of the batch after the current stream was done (never negative)."""
    return max(0.0, wall_ms - stream_ms)


def left_running(wall_ms: float, stream_ms: float) -> bool:
    """The rule of the module doc: more than OUTSIDE_SHARE of the wall time, and OUTSIDE_MIN_MS, came after
    the current stream was done."""
    return outside(wall_ms, stream_ms) > max(OUTSIDE_MIN_MS, OUTSIDE_SHARE * wall_ms)


def time_batch(fn: Callable[[], object], calls: int, device: torch.device) -> tuple[float, float]:
    """(wall_ms, stream_ms) of ``calls`` calls: the whole device's and the current stream's time."""
    import torch
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        start.synchronize()  # the clock starts when the start event has run: on a GPU other processes share, it
        t0 = time.perf_counter()  # may wait for their time slice, which is no time outside the timed stream
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3
        return wall_ms, start.elapsed_time(end)


def check(fn: Callable[[], object], device: torch.device, median_ms: float, batch: Batch = time_batch) -> dict:
    """The ``info["off_stream"]`` of a case: its batch's calls, wall_ms, stream_ms, outside_ms, and
    ``left_running`` (True when the rule marks it; then measured twice, the smaller outside time kept)."""
    calls = calls_for(median_ms)
    wall_ms, stream_ms = batch(fn, calls, device)
    marked = left_running(wall_ms, stream_ms)
    if marked:
        again = batch(fn, calls, device)
        marked = left_running(*again)
        if outside(*again) < outside(wall_ms, stream_ms):
            wall_ms, stream_ms = again
    return {"calls": calls, "wall_ms": round(wall_ms, 4), "stream_ms": round(stream_ms, 4),
            "outside_ms": round(outside(wall_ms, stream_ms), 4), "left_running": marked}


def reason(info: dict) -> str | None:
    """Why a record's time misses work (``info["off_stream"]`` marked), or None."""
    off = info.get("off_stream")
    if not isinstance(off, dict) or not off.get("left_running"):
        return None
    return (f"{off['calls']} calls kept the device busy {off['outside_ms']:.3g} ms of {off['wall_ms']:.3g} ms after "
            f"the timed stream was done: the kernel works on another stream that the caller's stream does not "
            f"wait for, so its time misses that work")

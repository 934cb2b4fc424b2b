"""CPU timing with ``time.perf_counter`` (CPU kernels are synchronous), counting preempted samples."""

from __future__ import annotations

import time
from collections.abc import Callable

from attnbench.timing import cpu_load
from attnbench.timing.config import TimingConfig


def time_cpu(fn: Callable[[], object], config: TimingConfig) -> tuple[list[float], dict]:
    """Milliseconds per call of ``fn`` after ``config.warmup`` calls, as many samples as ``config``'s
    sampling policy asks for (``TimingConfig.samples_wanted``; on CPU: no time cap unless set), and
    ``{"cpu": {...}}``: the threads, the samples, how many of them the process was switched out in, how
    long its threads waited for a core and the time measured (``cpu_load.is_busy`` judges it)."""
    if config.warmup:
        t0 = time.perf_counter()
        fn()
        for _ in range(config.warmup_calls((time.perf_counter() - t0) * 1e3, "cpu")):
            fn()
    samples: list[float] = []
    watch = cpu_load.Preemptions()
    start = time.perf_counter()
    while (count := config.samples_wanted(samples, "cpu", (time.perf_counter() - start) * 1e3)) > 0:
        for _ in range(count):
            before = watch.before()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
            watch.after(before)
    return samples, {"cpu": watch.info(sum(samples))}

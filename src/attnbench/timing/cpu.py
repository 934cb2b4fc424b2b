"""CPU timing with ``time.perf_counter`` (CPU kernels are synchronous)."""

from __future__ import annotations

import time
from collections.abc import Callable

from attnbench.timing.config import TimingConfig


def time_cpu(fn: Callable[[], object], config: TimingConfig) -> list[float]:
    """Milliseconds per call of ``fn`` after ``config.warmup`` calls, as many samples as ``config``'s
    sampling policy asks for (``TimingConfig.samples_wanted``; on CPU: no time cap unless set)."""
    if config.warmup:
        t0 = time.perf_counter()
        fn()
        for _ in range(config.warmup_calls((time.perf_counter() - t0) * 1e3, "cpu")):
            fn()
    samples: list[float] = []
    start = time.perf_counter()
    while (count := config.samples_wanted(samples, "cpu", (time.perf_counter() - start) * 1e3)) > 0:
        for _ in range(count):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples

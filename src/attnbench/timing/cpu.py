"""CPU timing with ``time.perf_counter`` (CPU kernels are synchronous)."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_cpu(fn: Callable[[], object], *, warmup: int, repeat: int, min_time_ms: float = 0.0,
             max_repeat: int | None = None, max_time_ms: float | None = None) -> list[float]:
    """Milliseconds of at least ``repeat`` calls of ``fn`` after ``warmup`` calls; more until the
    samples add up to ``min_time_ms`` (at most ``max_repeat``); fewer once they reach ``max_time_ms``
    (None: no cap on CPU; see TimingConfig)."""
    from attnbench.timing.config import TimingConfig
    policy = TimingConfig(warmup=warmup, repeat=repeat, min_time_ms=min_time_ms, max_time_ms=max_time_ms,
                          max_repeat=max(max_repeat or repeat, repeat))
    if warmup:
        t0 = time.perf_counter()
        fn()
        for _ in range(policy.warmup_calls((time.perf_counter() - t0) * 1e3, "cpu")):
            fn()
    samples: list[float] = []
    start = time.perf_counter()
    while (count := policy.samples_wanted(samples, "cpu", (time.perf_counter() - start) * 1e3)) > 0:
        for _ in range(count):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples

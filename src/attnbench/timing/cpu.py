"""CPU timing with ``time.perf_counter`` (CPU kernels are synchronous)."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_cpu(fn: Callable[[], object], *, warmup: int, repeat: int) -> list[float]:
    """Milliseconds of ``repeat`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples

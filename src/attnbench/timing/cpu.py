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
    import torch
    if config.warmup:
        t0 = time.perf_counter()
        fn()
        for _ in range(config.warmup_calls((time.perf_counter() - t0) * 1e3, "cpu")):
            fn()
    samples: list[float] = []
    preempted = 0
    switches = cpu_load.involuntary_switches
    known = switches() is not None
    delay_before = cpu_load.run_delay_ms()
    start = time.perf_counter()
    while (count := config.samples_wanted(samples, "cpu", (time.perf_counter() - start) * 1e3)) > 0:
        for _ in range(count):
            before = switches() if known else 0
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
            preempted += known and switches() > before
    delay_after = cpu_load.run_delay_ms()
    waited = None if delay_before is None or delay_after is None else round(delay_after - delay_before, 3)
    cpu = {"threads": torch.get_num_threads(), "samples": len(samples), "preempted": preempted if known else None,
           "waited_ms": waited, "measured_ms": round(sum(samples), 3)}
    cpu["busy"] = cpu_load.is_busy(cpu)
    return samples, {"cpu": cpu}

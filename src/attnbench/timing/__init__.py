"""Timing: one entry point, ``measure``, for every in-process mode and device.

``measure`` returns per-call samples in ms; ``measure_detailed`` also returns what the method
learned (kernel names, graph copies, a fallback and its reason). External profilers (ncu,
rocprofv3) re-run the case in a subprocess: see ``timing.external``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from attnbench.timing.config import ALL_MODES, EXTERNAL_MODES, TIMING_MODES, TimingConfig
from attnbench.timing.stats import describe, summarize

__all__ = ["ALL_MODES", "EXTERNAL_MODES", "TIMING_MODES", "Measurement", "TimingConfig", "describe", "measure",
           "measure_detailed", "summarize"]


@dataclass
class Measurement:
    """Samples (ms per call) and what the timing method reports about them."""

    samples_ms: list[float]
    info: dict = field(default_factory=dict)


def measure(fn: Callable[[], object], config: TimingConfig, device: str | torch.device,
            align: Callable[[], object] | None = None) -> list[float]:
    """Time ``fn`` as ``config`` says on ``device``; returns per-call samples in milliseconds.

    ``align``: for processes whose calls meet each other (see ``events.time_events``)."""
    return measure_detailed(fn, config, device, align).samples_ms


def _events(fn, config: TimingConfig, device: torch.device, align=None, info: dict | None = None) -> Measurement:
    from attnbench.timing.events import time_events_detailed
    samples, seen = time_events_detailed(fn, config, device, align)
    return Measurement(samples, seen | (info or {}))


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as ``timeit`` does), back to its state after.

    A collection inside a timed batch stops the host from queueing calls (a full one took 0.3-0.4 s
    with every kernel package loaded, before the runner's ``gc.freeze``): the device drains the queue,
    and the later calls of that chunk whose launch costs more host time than their kernel would be
    timed at the host's pace. (The unsettled cases that ``RETIME_CI_PCT`` retimes are not this: as
    many were retimed with the collector paused, H100 2026-11-24.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def measure_detailed(fn: Callable[[], object] | Sequence[Callable[[], object]], config: TimingConfig,
                     device: str | torch.device, align: Callable[[], object] | None = None) -> Measurement:
    """Time ``fn`` (or, in graph mode, closures prepared over different input copies) on ``device``,
    with the garbage collector paused."""
    import torch

    with collection_paused():
        return _measure(fn, config, torch.device(device), align)


def _measure(fn, config: TimingConfig, device: torch.device, align) -> Measurement:
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if device.type == "cpu":
        from attnbench.timing.cpu import time_cpu
        return Measurement(*time_cpu(fns[0], config))
    if config.mode == "graph":
        from attnbench.timing.graphs import GraphCaptureError, time_graph
        try:
            samples, info = time_graph(fns, config, device)
        except GraphCaptureError as exc:
            return _events(fns[0], config, device,
                           info={"graph_fallback": f"CUDA graph capture failed, timed with events: {exc}"})
        return Measurement(samples, info)
    if config.mode == "profiler":
        from attnbench.timing.profiler import time_profiler
        samples, info = time_profiler(fns[0], warmup=config.warmup, repeat=config.repeat, cold_l2=config.cold_l2,
                                      device=device)
        return Measurement(samples, info)
    if config.external:
        raise ValueError(f"timing mode {config.mode!r} re-runs the case under a profiler: use timing.external")
    return _events(fns[0], config, device, align)

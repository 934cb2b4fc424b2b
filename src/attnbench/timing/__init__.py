"""Timing: one entry point, ``measure``, for every in-process mode and device.

``measure`` returns per-call samples in ms; ``measure_detailed`` also returns what the method
learned (kernel names, graph copies, a fallback and its reason). External profilers (ncu,
rocprofv3) re-run the case in a subprocess: see ``timing.external``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


def _events(fn, config: TimingConfig, device: torch.device, align=None) -> list[float]:
    from attnbench.timing.events import time_events
    return time_events(fn, config, device, align)


def measure_detailed(fn: Callable[[], object] | Sequence[Callable[[], object]], config: TimingConfig,
                     device: str | torch.device, align: Callable[[], object] | None = None) -> Measurement:
    """Time ``fn`` (or, in graph mode, closures prepared over different input copies) on ``device``."""
    device = torch.device(device)
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if device.type == "cpu":
        from attnbench.timing.cpu import time_cpu
        return Measurement(time_cpu(fns[0], config))
    if config.mode == "graph":
        from attnbench.timing.graphs import GraphCaptureError, time_graph
        try:
            samples, info = time_graph(fns, config, device)
        except GraphCaptureError as exc:
            return Measurement(_events(fns[0], config, device),
                               {"graph_fallback": f"CUDA graph capture failed, timed with events: {exc}"})
        return Measurement(samples, info)
    if config.mode == "profiler":
        from attnbench.timing.profiler import time_profiler
        samples, info = time_profiler(fns[0], warmup=config.warmup, repeat=config.repeat, cold_l2=config.cold_l2,
                                      device=device)
        return Measurement(samples, info)
    if config.external:
        raise ValueError(f"timing mode {config.mode!r} re-runs the case under a profiler: use timing.external")
    return Measurement(_events(fns[0], config, device, align))

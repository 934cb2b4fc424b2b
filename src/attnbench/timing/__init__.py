"""Timing: one entry point, ``measure``, for every mode and device."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.timing.config import TIMING_MODES, TimingConfig
from attnbench.timing.stats import summarize

__all__ = ["TIMING_MODES", "TimingConfig", "measure", "summarize"]


def measure(fn: Callable[[], object], config: TimingConfig, device: str | torch.device) -> list[float]:
    """Time ``fn`` as ``config`` says on ``device``; returns per-call samples in milliseconds."""
    device = torch.device(device)
    if device.type == "cpu":
        from attnbench.timing.cpu import time_cpu
        return time_cpu(fn, warmup=config.warmup, repeat=config.repeat)
    from attnbench.timing.events import time_events
    return time_events(fn, warmup=config.warmup, repeat=config.repeat, cold_l2=config.cold_l2, device=device)

"""How a closure is timed."""

from __future__ import annotations

from dataclasses import dataclass

TIMING_MODES = ("events",)


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    """Warm-up, repetitions and method of one measurement."""

    warmup: int = 10
    """Untimed calls before measuring (compilation, autotuning, allocator warm-up)."""
    repeat: int = 100
    """Timed calls; each gives one sample."""
    cold_l2: bool = True
    """Flush the GPU L2 cache before every timed call (ignored on CPU)."""
    mode: str = "events"
    """events: CUDA events around each call (CPU: perf_counter)."""

    def __post_init__(self) -> None:
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise ValueError(f"repeat must be a positive integer, got {self.repeat!r}")
        if self.mode not in TIMING_MODES:
            raise ValueError(f"unknown timing mode {self.mode!r}; allowed: {', '.join(TIMING_MODES)}")

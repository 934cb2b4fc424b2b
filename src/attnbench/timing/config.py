"""How a closure is timed: the method (mode) and how many samples are enough."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# In-process modes (timing.measure runs them) and modes that re-run the case under an external profiler.
TIMING_MODES = ("events", "graph", "profiler")
EXTERNAL_MODES = ("ncu", "nsys", "rocprof")
ALL_MODES = TIMING_MODES + EXTERNAL_MODES
GPU_MIN_TIME_MS = 100.0
GPU_MAX_TIME_MS = 150.0
"""GPU time cap per case (the default precision: see CI_TARGET_PCT)."""
CPU_MIN_TIME_MS = 100.0
CPU_MAX_TIME_MS = 1000.0
"""CPU: sample at least 100 ms (a CPU call's time wanders with the OS, five samples were not enough to
compare two runs), at most 1 s per case."""
MIN_SAMPLES = 10
"""Fewest samples of a case, whatever the time cap (a median and its CI need a few)."""
CI_TARGET_PCT = 0.3
"""Default precision goal: sampling stops once the 95% CI of the median is within +-0.3% of it. Tighter buys
nothing a user can rely on: the same case run again minutes later moves by more than that (clocks; see
docs/results/2026-11-24-h100-precision.md). ``--precise`` asks for PRECISE."""
RETIME_CI_PCT = 5.0
"""A case whose median is known only to worse than +-5% (95% CI) when sampling stops is timed once more,
and the measurement with the narrower CI is kept (both medians go in the record, info["retimed"]). On
the GPU machines about one case in sixty ends so: samples that split into the kernel's own time and a
slow mode 1.5-12x longer for part of the case, whose median lands in the slow mode (H100 default sweeps
on 2026-11-24: fa3 S=2k fwd_bwd 0.86 ms against 0.43 in two other runs, p10 0.43 ms; naive S=256 causal
0.40 against 0.06, p10 0.06). The CI of a steady case is under 1% (p90 of the sweep), under 3.5% at the
longest shapes whose clocks fall."""
PRECISE = {"ci_target_pct": 0.1, "max_time_ms": 350.0}
"""``--precise``: the tight setting (a 0.1% CI goal, 350 ms a case on a GPU), about twice the timing (H100 default sweep: 163 s of timing for 736 cases with it, 83-91 s for 800 without)."""


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    """Warm-up, repetitions and method of one measurement."""

    warmup: int = 10
    """Untimed calls before measuring (compilation, autotuning, allocator warm-up)."""
    repeat: int = 100
    """Minimum number of timed samples."""
    cold_l2: bool = True
    """Flush the GPU L2 cache before every timed call (ignored on CPU)."""
    mode: str = "events"
    """events: CUDA events per call (CPU: perf_counter); graph: CUDA-graph replays of many calls over
    rotating input copies; profiler: device kernel time from torch.profiler; ncu / nsys / rocprof: kernel
    time from a re-run of the case under Nsight Compute / Nsight Systems / rocprofv3."""
    min_time_ms: float | None = None
    """Keep sampling until the samples add up to this many ms; None = 100 ms (GPU and CPU)."""
    max_time_ms: float | None = None
    """Stop sampling once the samples add up to this many ms, or this much wall time went into sampling,
    even before ``repeat`` samples (but never with fewer than MIN_SAMPLES); warm-up stops after about a
    quarter of it. None = 150 ms on GPU, 1000 ms on CPU (or min_time_ms if larger); inf = no cap. Keeps
    slow kernels (naive or math attention at long sequences, 100+ ms a call) from costing
    ``warmup + repeat`` calls each, and host-bound small ones from taking thousands of samples."""
    ci_target_pct: float = CI_TARGET_PCT
    """Stop sampling once ``repeat`` samples are taken and the 95% bootstrap CI of their median (the one
    the record reports) lies within +- this percent of the median, even before ``min_time_ms``: a
    steady kernel is not sampled for longer than its number needs. 0 = off (sample to the minimum time)."""
    idle_ratio: float = 0.0
    """events mode: leave the device idle for this many times the call's median time before each timed
    call. 0 (default) measures under sustained load, as a training step runs; 1 or more lets a
    power-limited GPU keep the boost clock it has for isolated calls (what ncu measures)."""
    max_repeat: int = 10_000
    """Cap on the number of samples however fast the kernel is."""
    graph_target_ms: float = 2.0
    """graph mode: calls per captured graph are chosen so one replay lasts about this long."""
    graph_max_copies: int = 32
    """graph mode: most input copies rotated through to keep inputs out of L2."""
    profiler_batch: int = 32
    """ncu / nsys / rocprof: most cases of one backend profiled in one profiler process (1 = a process per
    case, as a case run on its own is)."""
    fresh_inputs: bool = False
    """Hand each timed call inputs of values of its own (a rotating pool of input sets drawn with other seeds)
    and check what the calls returned (``timing.fresh``); in-process modes only."""

    def __post_init__(self) -> None:
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise ValueError(f"repeat must be a positive integer, got {self.repeat!r}")
        if self.mode not in ALL_MODES:
            raise ValueError(f"unknown timing mode {self.mode!r}; allowed: {', '.join(ALL_MODES)}")
        if self.min_time_ms is not None and not (self.min_time_ms >= 0 and math.isfinite(self.min_time_ms)):
            raise ValueError(f"min_time_ms must be a number >= 0, got {self.min_time_ms!r}")
        if self.max_time_ms is not None and not self.max_time_ms > 0:  # inf = no cap
            raise ValueError(f"max_time_ms must be a number > 0, got {self.max_time_ms!r}")
        if self.max_time_ms is not None and self.min_time_ms is not None and self.max_time_ms < self.min_time_ms:
            raise ValueError(f"max_time_ms ({self.max_time_ms}) must be >= min_time_ms ({self.min_time_ms})")
        if not (self.ci_target_pct >= 0 and math.isfinite(self.ci_target_pct)):
            raise ValueError(f"ci_target_pct must be a number >= 0, got {self.ci_target_pct!r}")
        if not (self.idle_ratio >= 0 and math.isfinite(self.idle_ratio)):
            raise ValueError(f"idle_ratio must be a number >= 0, got {self.idle_ratio!r}")
        if self.max_repeat < self.repeat:
            raise ValueError(f"max_repeat ({self.max_repeat}) must be >= repeat ({self.repeat})")
        if isinstance(self.profiler_batch, bool) or not isinstance(self.profiler_batch, int) or self.profiler_batch < 1:
            raise ValueError(f"--profiler-batch must be an integer >= 1, got {self.profiler_batch!r}")
        if self.fresh_inputs and self.external:
            raise ValueError(f"--fresh-inputs hands inputs to the calls timed in this process; --profiler {self.mode} "
                             f"re-runs the case in a process of its own: use events, graph or --profiler torch")
        if self.graph_max_copies < 1:
            raise ValueError(f"graph_max_copies must be >= 1, got {self.graph_max_copies!r}")

    def fixed(self) -> TimingConfig:
        """The same config taking exactly ``warmup`` and ``repeat`` calls, whatever they measure: for
        processes that must call in lockstep (ranks of a distributed job meet in collectives)."""
        return replace(self, min_time_ms=0.0, max_time_ms=math.inf)

    @property
    def external(self) -> bool:
        """True when the case is re-run under an external profiler."""
        return self.mode in EXTERNAL_MODES

    def min_time_for(self, device_type: str) -> float:
        """The minimum total measured time in ms on a device type (cpu or cuda)."""
        if self.min_time_ms is not None:
            return float(self.min_time_ms)
        return CPU_MIN_TIME_MS if device_type == "cpu" else GPU_MIN_TIME_MS

    def max_time_for(self, device_type: str) -> float:
        """The time cap in ms on a device type (inf = none)."""
        if self.max_time_ms is not None:
            return float(self.max_time_ms)
        cap = CPU_MAX_TIME_MS if device_type == "cpu" else GPU_MAX_TIME_MS
        return max(cap, self.min_time_for(device_type))

    def warmup_calls(self, first_call_ms: float, device_type: str) -> int:
        """Warm-up calls still to make after a first one that took ``first_call_ms`` (wall, synchronized)."""
        budget = self.max_time_for(device_type) / 4
        if self.warmup <= 1 or not math.isfinite(budget):
            return max(self.warmup - 1, 0)
        return int(min(self.warmup - 1, budget // max(first_call_ms, 1e-6)))

    def calls_within_cap(self, requested: int, per_call_ms: float, device_type: str) -> int:
        """Calls to launch in one go of a call costing ``per_call_ms`` (an external profiler's timed range):
        ``requested``, fewer where they would add up to more than the time cap, where ``samples_wanted`` stops
        sampling (never fewer than MIN_SAMPLES)."""
        cap = self.max_time_for(device_type)
        if not math.isfinite(cap):
            return requested
        return min(requested, max(MIN_SAMPLES, int(cap // max(per_call_ms, 1e-6))))

    def samples_wanted(self, samples_ms: list[float], device_type: str, elapsed_ms: float | None = None) -> int:
        """How many more samples to take: 0 once both ``repeat`` and the minimum time are met, or the
        time cap is reached (with at least MIN_SAMPLES), or ``max_repeat``. ``elapsed_ms`` is the wall
        time spent sampling so far: the cap counts it when it exceeds the measured time (host-bound
        calls, L2 flushes)."""
        n = len(samples_ms)
        total = float(sum(samples_ms))
        spent, cap = max(total, elapsed_ms or 0.0), self.max_time_for(device_type)
        if n >= self.max_repeat or (n >= MIN_SAMPLES and spent >= cap):
            return 0
        median = max(sorted(samples_ms)[n // 2], 1e-6) if n else None
        per_call = max(median, (elapsed_ms or 0.0) / n) if n else None  # wall cost of one more sample
        if n < self.repeat:
            want = self.repeat - n
            if math.isfinite(cap):  # first a few samples to learn the per-call time, then only what fits
                want = min(want, MIN_SAMPLES) if per_call is None else \
                    min(want, max(MIN_SAMPLES - n, math.ceil((cap - spent) / per_call), 1))
            return want
        floor = self.min_time_for(device_type)
        if total >= floor or self.precise_enough(samples_ms):
            return 0
        want = math.ceil((floor - total) / median)
        if math.isfinite(cap):
            want = min(want, math.ceil((cap - spent) / per_call))
        if self.ci_target_pct > 0:  # look again after at most doubling the samples
            want = min(want, n)
        return int(min(max(want, 1), self.max_repeat - n))

    def precise_enough(self, samples_ms: list[float]) -> bool:
        """Whether the samples' median CI is within ``ci_target_pct`` (False when the target is off)."""
        if self.ci_target_pct <= 0 or len(samples_ms) < MIN_SAMPLES:
            return False
        from attnbench.timing.stats import median_ci_half_width_pct
        return median_ci_half_width_pct(samples_ms) <= self.ci_target_pct

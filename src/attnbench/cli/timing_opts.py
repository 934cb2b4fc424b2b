"""`run`'s measurement options: --timing, --profiler, --min-time-ms, --ci-target, --idle-ratio, --fresh-inputs,
--trace, --cooldown."""

from __future__ import annotations

import math
import os
from pathlib import Path

from attnbench.cli.common import UserError, shown
from attnbench.timing import TIMING_MODES, TimingConfig
from attnbench.timing.config import PRECISE

PROFILERS = ("none", "torch", "ncu", "nsys", "rocprof")


def _mode(timing: str, profiler: str, explicit_timing: bool) -> str:
    if profiler == "torch":
        if explicit_timing and timing != "profiler" and timing != "events":
            raise UserError(f"--profiler torch is --timing profiler; it cannot be combined with --timing {timing}")
        return "profiler"
    if profiler in ("ncu", "nsys", "rocprof"):
        if explicit_timing and timing != "events":
            raise UserError(f"--profiler {profiler} times kernels itself; drop --timing {timing}")
        return profiler
    return timing


def _check_tools(profiler: str) -> None:
    if profiler in ("ncu", "nsys", "rocprof"):
        from attnbench.timing.external import TOOLS, find_tool
        if find_tool(profiler) is None:
            hint = " (on the GPU machines here: see docs/guide.md, Nsight Systems)" if profiler == "nsys" else ""
            raise UserError(f"--profiler {profiler}: {TOOLS[profiler]} is not installed or not on PATH{hint}")


LIMITS = {"--min-time-ms": 3_600_000.0, "--max-time-ms": 3_600_000.0, "--ci-target": 100.0, "--idle-ratio": 1000.0,
          "--cooldown": 3600.0}
"""Largest accepted values (an hour of sampling or of pause per case; larger ones are typos that would look
like a hang or overflow a timer)."""


def _nonneg(value, name: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    hi = LIMITS[name]
    if not (0 <= number <= hi):
        raise UserError(f"bad {name} {shown(value)}: expected a number in 0..{hi:g}")
    return number


def _given(**values) -> dict:
    """The keyword arguments that were given (None = leave the dataclass default)."""
    return {k: v for k, v in values.items() if v is not None}


def resolve(opts: dict, device: str) -> tuple[TimingConfig, str]:
    """TimingConfig and profiler name from the merged options; UserError for anything invalid."""
    timing = str(opts.get("timing") or "events").lower()
    profiler = str(opts.get("profiler") or "none").lower()
    if timing not in TIMING_MODES:
        raise UserError(f"bad --timing {timing!r}; allowed: {', '.join(TIMING_MODES)}")
    if profiler not in PROFILERS:
        raise UserError(f"bad --profiler {profiler!r}; allowed: {', '.join(PROFILERS)}")
    mode = _mode(timing, profiler, opts.get("timing") is not None)
    _check_tools(profiler)
    if device == "cpu" and (mode != "events" or profiler != "none"):
        what = f"--profiler {profiler}" if profiler != "none" else f"--timing {timing}"
        raise UserError(f"{what} needs a CUDA/ROCm device; on CPU attnbench times with perf_counter")
    if opts.get("fresh_inputs") is True and opts.get("check") is False:  # it would rotate inputs, catching nothing
        raise UserError("--fresh-inputs checks what the timed calls return, which --no-check turns off: drop one")
    cpu = device == "cpu"
    precise = PRECISE if opts.get("precise") is True else {}
    if precise and cpu:
        precise = {"ci_target_pct": precise["ci_target_pct"]}  # the CPU's cap is already 1 s
    try:
        config = TimingConfig(warmup=opts["warmup"] if opts.get("warmup") is not None else (2 if cpu else 10),
                              repeat=opts["repeat"] if opts.get("repeat") is not None else (10 if cpu else 30),
                              cold_l2=not opts.get("warm_l2", False), mode=mode,
                              fresh_inputs=opts.get("fresh_inputs") is True,
                              min_time_ms=_nonneg(opts.get("min_time_ms"), "--min-time-ms"),
                              **{**precise, **_given(
                                  max_time_ms=_nonneg(opts.get("max_time_ms"), "--max-time-ms"),
                                  ci_target_pct=_nonneg(opts.get("ci_target"), "--ci-target"),
                                  idle_ratio=_nonneg(opts.get("idle_ratio"), "--idle-ratio"),
                                  profiler_batch=opts.get("profiler_batch"))})
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return config, profiler


def check_trace_dir(path: Path) -> None:
    """--trace DIR: a folder, or a path where one can be made (checked before any case runs)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"bad --trace {shown(str(path))}: it is a file; give a folder for the traces")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"bad --trace {shown(str(path))}: {parent} is not a folder this process can write")


def run_options(opts: dict) -> dict:
    """RunOptions fields for --trace and --cooldown."""
    trace = opts.get("trace")
    if trace:
        check_trace_dir(Path(str(trace)))
    return {"trace_dir": str(trace) if trace else None, "cooldown_s": _nonneg(opts.get("cooldown"), "--cooldown") or 0.0}


MAX_THREADS = 4096


def cpu_plan(opts: dict, device: str):
    """CPU runs: --threads N, or the threads ``cpu_load.plan`` chooses (None on a GPU, where it is ignored)."""
    if device != "cpu":
        return None
    from attnbench.cli.common import option_int
    from attnbench.timing import cpu_load
    given = opts.get("threads")
    return cpu_load.plan(None if given is None else option_int(opts, "threads", 1, MAX_THREADS, default=1))

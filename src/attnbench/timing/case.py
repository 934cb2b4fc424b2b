"""Timing one prepared case the way its TimingConfig says, with everything the record should know.

The runner calls ``time_prepared`` once per case. It adds to the record's info: the CI of the median
and the outliers, the GPU clock/temperature at the start and end, their min/median/max across the timed
calls (``gpu_state.window``; ``clock_dropped`` when the clock fell by over 10% from the start's, at the end
or anywhere in the window), the host's cost to issue a call (``launch``, events mode), what the
method reports (kernel names, graph copies and whether inputs were cold, a fallback and its reason),
on a GPU whether the calls left work running off the timed stream (``timing.streams``, ``off_stream``),
with ``--fresh-inputs`` how many input sets the calls rotated over (``timing.fresh``) and, with a trace
directory, the path of a Chrome/Perfetto trace of the case.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from attnbench import operators
from attnbench.timing import cpu_load, measure_detailed, streams
from attnbench.timing.clocks import ClockMonitor, WindowSampler, clock_dropped, window_summary
from attnbench.timing.config import RETIME_CI_PCT, TimingConfig
from attnbench.timing.stats import describe, median_ci_half_width_pct

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CaseContext:
    """How to time: config, device, seed of the inputs, optional trace directory."""

    config: TimingConfig
    """Mode, warm-up, repeat, minimum time."""
    device: torch.device
    """Where the case runs."""
    seed: int = 0
    """Seed of the inputs (the external child redraws them)."""
    inputs: dict | None = None
    """How the inputs were drawn (``InputDist.describe()``), for the external child; None = N(0, 1)."""
    trace_dir: str | None = None
    """Write a Chrome/Perfetto trace per case here (None = no trace)."""
    sessions: object | None = None
    """The run's ``external.ProfileSessions`` (external profilers: one process per backend); None = a process
    for this case alone."""
    backend_options: dict | None = None
    """Backend name -> constructor options, for the external child that builds the backends again."""


def graph_closures(spec, backend, inputs, prepared, ctx: CaseContext, fresh=None) -> tuple[list, dict]:
    """The prepared closure plus closures prepared over fresh input copies, enough to keep inputs cold; with
    ``fresh`` (``timing.fresh.FreshInputs``) the copies are its input sets, of values of their own."""
    from attnbench.timing.events import l2_bytes
    from attnbench.timing.graphs import clone_inputs, copies_for, tensor_bytes
    copy_bytes = tensor_bytes(inputs)
    free, _ = torch.cuda.mem_get_info(ctx.device)
    l2 = l2_bytes(ctx.device)
    per_call = operators.of(spec).bytes_moved(spec, inputs=inputs)
    copies, cold = copies_for(per_call, l2, max_copies=ctx.config.graph_max_copies, copy_bytes=copy_bytes,
                              free_bytes=free)
    if fresh is not None:
        fresh.extend(copies)
        fns = fresh.closures()
    else:
        fns = [prepared.fn] + [backend.prepare_case(spec, clone_inputs(inputs)).fn for _ in range(copies - 1)]
    info = {"graph_cold": cold}
    if not cold:
        info["graph_note"] = (f"{copies} input copies x {per_call / 2**20:.1f} MiB per call do not "
                              f"evict a {l2 / 2**20:.0f} MiB L2: inputs may be partly L2-resident")
    return fns, info


def _measure_settled(fns, ctx: CaseContext) -> tuple[list[float], dict]:
    """Measure; on a GPU, measure once more when the median came out unsettled (CI wider than
    RETIME_CI_PCT) and keep the measurement whose median is known better. Both go in the record."""
    measured = measure_detailed(fns, ctx.config, ctx.device)
    if ctx.device.type == "cpu":
        return _settled_on_cpu(measured, fns, ctx)
    if ctx.device.type != "cuda" or not ctx.config.ci_target_pct:
        return measured.samples_ms, measured.info
    first_ci = median_ci_half_width_pct(measured.samples_ms)
    if not first_ci > RETIME_CI_PCT:
        return measured.samples_ms, measured.info
    again = measure_detailed(fns, ctx.config, ctx.device)
    second_ci = median_ci_half_width_pct(again.samples_ms)
    keep = again if second_ci < first_ci else measured
    first_median = float(np.median(measured.samples_ms))
    retimed = {"first_median_ms": first_median, "first_ci_pct": round(first_ci, 2),
               "second_ci_pct": round(second_ci, 2), "kept": "second" if keep is again else "first"}
    log.info("unsettled median (CI +-%.1f%%), timed again (CI +-%.1f%%)", first_ci, second_ci)
    return keep.samples_ms, keep.info | {"retimed": retimed}


def _settled_on_cpu(measured, fns, ctx: CaseContext) -> tuple[list[float], dict]:
    """A case whose samples were preempted by other processes (``cpu_load.was_preempted``) is timed once more,
    with fewer threads when other processes took cores since the run chose its count; the measurement
    with fewer preempted samples is kept, still marked busy if it is."""
    if not cpu_load.was_preempted(measured.info.get("cpu")):  # other processes' mere presence: marked, not retimed
        return measured.samples_ms, measured.info
    before, after = cpu_load.relieve()
    again = measure_detailed(fns, ctx.config, ctx.device)
    first, second = measured.info["cpu"], again.info["cpu"]
    keep = again if cpu_load.disturbance(second) <= cpu_load.disturbance(first) else measured
    retimed = {"first_median_ms": float(np.median(measured.samples_ms)),
               "first_preempted": f"{first['preempted']}/{first['samples']}",
               "kept": "second" if keep is again else "first"}
    if after < before:
        retimed["threads_lowered_from"] = before
    log.info("samples preempted by other processes (%s), timed again", retimed["first_preempted"])
    return keep.samples_ms, keep.info | {"cpu": keep.info["cpu"] | {"retimed": retimed}}


def profile_sessions(ctx: CaseContext, cases, stopped=lambda: False):
    """The ``ProfileSessions`` that times ``cases`` ((spec, backend name) pairs) under ctx's external profiler."""
    from attnbench.timing.external import ProfileSessions
    return ProfileSessions(ctx.config.mode, cases, iterations=ctx.config.repeat, device=str(ctx.device),
                           seed=ctx.seed, warmup=max(1, ctx.config.warmup), cold_l2=ctx.config.cold_l2,
                           inputs=ctx.inputs, batch=ctx.config.profiler_batch,
                           max_time_ms=ctx.config.max_time_for(ctx.device.type), stopped=stopped,
                           backend_options=ctx.backend_options)


def _external(spec, backend, ctx: CaseContext) -> tuple[list[float], dict]:
    sessions = ctx.sessions or profile_sessions(ctx, [(spec, backend.name)])
    return sessions.measure(spec, backend.name)


def time_side_calls(side: dict, ctx: CaseContext) -> dict:
    """Each side call's (``Prepared.side``) info with its median time per call, timed apart from the attention by
    CUDA events (CPU: perf_counter) with the run's L2 setting and sampling."""
    config = ctx.config if ctx.config.mode == "events" else replace(ctx.config, mode="events")
    out = {}
    for name, call in side.items():
        samples = measure_detailed(call.fn, config, ctx.device).samples_ms
        out[name] = call.info | {"median_ms": float(np.median(samples)), "samples": len(samples),
                                 "timing": "cpu" if ctx.device.type == "cpu" else "events"}
    return out


def window_sampler(clocks: ClockMonitor) -> WindowSampler | None:
    """A sampler of the device's clock, power and temperature, or None where no read is cheap enough."""
    found = clocks.reader()
    return WindowSampler(found[0], source=found[1]) if found else None


def _lowest(window: dict) -> float | None:
    return (window.get("sm_clock_mhz") or {}).get("min")


def gpu_state(start: dict, end: dict, window: dict) -> dict:
    """``gpu_state`` (the readings at the start and end, the window's summary) and ``clock_dropped`` when the SM
    clock fell by more than ``clocks.CLOCK_DROP`` from the start's at the end or at its lowest in the window."""
    if not (start or end or window):
        return {}
    out: dict = {"gpu_state": {"start": start, "end": end} | ({"window": window} if window else {})}
    if clock_dropped(start, end) or clock_dropped(start, {"sm_clock_mhz": _lowest(window)}):
        out["clock_dropped"] = True
    return out


def trace_path(trace_dir: str, spec, backend_name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{backend_name}_{spec.label()}_{spec.pass_}").strip("_")
    return Path(trace_dir) / f"{stem}.json"


def time_prepared(spec, backend, inputs, prepared, ctx: CaseContext,
                  clocks: ClockMonitor | None = None, fresh=None) -> tuple[list[float], dict]:
    """Samples (ms per call) of the case and the info to merge into its record. ``fresh``
    (``timing.fresh.FreshInputs``, ``--fresh-inputs``): the timed calls rotate over its input sets."""
    info: dict = {}
    start = clocks.sample() if clocks else {}
    # an external profiler times the case in a process of its own, at a moment this one does not know
    sampler = window_sampler(clocks) if clocks and not ctx.config.external else None
    if sampler is not None:
        sampler.start()
    try:
        if ctx.config.external:
            samples, extra = _external(spec, backend, ctx)
        elif ctx.config.mode == "graph" and ctx.device.type == "cuda":
            fns, extra = graph_closures(spec, backend, inputs, prepared, ctx, fresh)
            samples, measured_info = _measure_settled(fns, ctx)
            extra = extra | measured_info
            del fns
        else:
            samples, extra = _measure_settled(prepared.fn if fresh is None else fresh.rotation(), ctx)
    finally:
        readings = sampler.stop() if sampler is not None else []
    end = clocks.sample() if clocks else {}
    timed = extra.pop("timed_s", None)
    info.update(extra)
    window = window_summary(readings, tuple(timed) if timed else None, source=sampler.source,
                            interval_ms=sampler.interval_ms) if sampler is not None else {}
    info.update(gpu_state(start, end, window))
    if info.get("clock_dropped"):
        # recorded (info.clock_dropped) and shown as a mark in the summary; a log line per case would bury it
        log.info("%s %s %s: SM clock fell from %s MHz during the case (lowest %s, at the end %s)", backend.name,
                 spec.label(), spec.pass_, start.get("sm_clock_mhz"), _lowest(window), end.get("sm_clock_mhz"))
    info.update(describe(samples))
    if fresh is not None:
        info["fresh_inputs"] = fresh.describe()
    if ctx.device.type == "cuda" and not ctx.config.external:
        info["off_stream"] = streams.check(prepared.fn, ctx.device, float(np.median(samples)))
    if prepared.side and not ctx.config.external:  # a profiler re-run times the attention alone
        info.update(time_side_calls(prepared.side, ctx))
    if ctx.trace_dir:
        from attnbench.timing.profiler import export_trace
        info["trace"] = str(export_trace(prepared.fn, trace_path(ctx.trace_dir, spec, backend.name), ctx.device))
    return samples, info

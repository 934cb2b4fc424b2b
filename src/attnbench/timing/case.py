"""Timing one prepared case the way its TimingConfig says, with everything the record should know.

The runner calls ``time_prepared`` once per case. It adds to the record's info: the CI of the median
and the outliers, the GPU clock/temperature at the start and end (and ``clock_dropped``), what the
method reports (kernel names, graph copies and whether inputs were cold, a fallback and its reason)
and, with a trace directory, the path of a Chrome/Perfetto trace of the case.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench import metrics
from attnbench.timing import measure_detailed
from attnbench.timing.clocks import ClockMonitor, clock_dropped
from attnbench.timing.config import TimingConfig
from attnbench.timing.stats import describe

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


def graph_closures(spec, backend, inputs, prepared, ctx: CaseContext) -> tuple[list, dict]:
    """The prepared closure plus closures prepared over fresh input copies, enough to keep inputs cold."""
    from attnbench.timing.events import l2_bytes
    from attnbench.timing.graphs import clone_inputs, copies_for
    copy_bytes = sum(t.numel() * t.element_size() for t in (inputs.q, inputs.k, inputs.v, inputs.dout))
    free, _ = torch.cuda.mem_get_info(ctx.device)
    l2 = l2_bytes(ctx.device)
    copies, cold = copies_for(metrics.bytes_moved(spec), l2, max_copies=ctx.config.graph_max_copies,
                              copy_bytes=copy_bytes, free_bytes=free)
    fns = [prepared.fn] + [backend.prepare(spec, clone_inputs(inputs)).fn for _ in range(copies - 1)]
    info = {"graph_cold": cold}
    if not cold:
        info["graph_note"] = (f"{copies} input copies x {metrics.bytes_moved(spec) / 2**20:.1f} MiB per call do not "
                              f"evict a {l2 / 2**20:.0f} MiB L2: inputs may be partly L2-resident")
    return fns, info


def _external(spec, backend, ctx: CaseContext) -> tuple[list[float], dict]:
    from attnbench.timing.external import ExternalCase, run_external
    case = ExternalCase(spec=spec, backend=backend.name, iterations=ctx.config.repeat)
    (samples, info), = run_external(ctx.config.mode, [case], device=str(ctx.device), seed=ctx.seed,
                                    warmup=max(1, ctx.config.warmup), cold_l2=ctx.config.cold_l2, inputs=ctx.inputs)
    return samples, info


def trace_path(trace_dir: str, spec, backend_name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{backend_name}_{spec.label()}_{spec.pass_}").strip("_")
    return Path(trace_dir) / f"{stem}.json"


def time_prepared(spec, backend, inputs, prepared, ctx: CaseContext,
                  clocks: ClockMonitor | None = None) -> tuple[list[float], dict]:
    """Samples (ms per call) of the case and the info to merge into its record."""
    info: dict = {}
    start = clocks.sample() if clocks else {}
    if ctx.config.external:
        samples, extra = _external(spec, backend, ctx)
    elif ctx.config.mode == "graph" and ctx.device.type == "cuda":
        fns, extra = graph_closures(spec, backend, inputs, prepared, ctx)
        measured = measure_detailed(fns, ctx.config, ctx.device)
        samples, extra = measured.samples_ms, extra | measured.info
        del fns
    else:
        measured = measure_detailed(prepared.fn, ctx.config, ctx.device)
        samples, extra = measured.samples_ms, measured.info
    end = clocks.sample() if clocks else {}
    info.update(extra)
    if start or end:
        info["gpu_state"] = {"start": start, "end": end}
        if clock_dropped(start, end):
            info["clock_dropped"] = True
            # recorded (info.clock_dropped) and shown as a mark in the summary; a log line per case would bury it
            log.info("%s %s %s: SM clock dropped from %s to %s MHz during the case", backend.name, spec.label(),
                        spec.pass_, start.get("sm_clock_mhz"), end.get("sm_clock_mhz"))
    info.update(describe(samples))
    if ctx.trace_dir:
        from attnbench.timing.profiler import export_trace
        info["trace"] = str(export_trace(prepared.fn, trace_path(ctx.trace_dir, spec, backend.name), ctx.device))
    return samples, info

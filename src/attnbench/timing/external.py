"""Re-run cases under an external profiler (ncu, nsys, rocprofv3) in a subprocess and read kernel times.

The parent writes a job file for ``attnbench.timing.child``, runs it under the profiler, parses the
profiler's output into an ordered kernel list and cuts it into calls (``marked.py``). Each sample
is the summed device duration of one call's kernels; the info names the kernels. A sweep profiles a
backend's cases together, one profiler process for many cases (``ProfileSessions``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnbench.results import scratch
from attnbench.spec import AttnSpec
from attnbench.timing import ncu as ncu_mod
from attnbench.timing import nsys as nsys_mod
from attnbench.timing import rocprof as rocprof_mod
from attnbench.timing.marked import iteration_times_ms, kernel_names, kernel_times_ms, split_marked

log = logging.getLogger(__name__)

TOOLS = {"ncu": "ncu", "nsys": "nsys", "rocprof": "rocprofv3"}


@dataclass(frozen=True, kw_only=True)
class ExternalCase:
    """One case for the child process."""

    spec: AttnSpec
    """The case."""
    backend: str
    """Backend registry name."""
    iterations: int
    """Profiled calls (one sample each)."""


def find_tool(tool: str) -> str | None:
    """Path of the profiler executable for ``tool`` (ncu, nsys or rocprof), or None."""
    return shutil.which(TOOLS[tool])


def child_command(job_path: Path) -> list[str]:
    return [sys.executable, "-m", "attnbench.timing.child", str(job_path)]


def _child_env() -> dict:
    # The child must import this very attnbench (a checkout run with PYTHONPATH=src included).
    src = str(Path(__file__).resolve().parents[2])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


class CaseFailed(RuntimeError):
    """The case failed in the profiled child before its timed range (the message says why)."""


Profiled = tuple[list[float], dict]
"""A profiled case: samples (ms per call) and the info for its record."""


def run_external(tool: str, cases: list[ExternalCase], *, device: str, seed: int = 0, warmup: int = 5,
                 cold_l2: bool = True, timeout_s: float = 900, inputs: dict | None = None,
                 max_time_ms: float | None = None, backend_options: dict | None = None) -> list[Profiled | CaseFailed]:
    """Every case measured under ``tool`` in one child process (``inputs``: how the inputs are drawn,
    ``InputDist.describe()``; None = N(0, 1); ``max_time_ms``: the events timer's cap, which bounds a case's
    calls as it bounds its samples; None = each case's ``iterations``): per case, in order, its samples and
    info, or the CaseFailed that says why it failed. The list is shorter than ``cases`` when the child stopped
    early (a failure that left the CUDA context unusable): the cases after it were not run. Raises RuntimeError
    when the profiler or the child failed as a whole (a crash, a failure inside a timed range)."""
    exe = find_tool(tool)
    if exe is None:
        raise FileNotFoundError(f"{TOOLS[tool]} is not installed or not on PATH")
    cold = cold_l2 and tool != "ncu"  # ncu flushes caches before every profiled kernel itself
    tmp = scratch.temp_dir("profile")  # a trace may take gigabytes: a killed run's is removed by the next one
    try:
        cap = max_time_ms if max_time_ms is not None and math.isfinite(max_time_ms) else None
        job = {"device": device, "seed": seed, "inputs": inputs, "warmup": warmup, "cold_l2": cold,
               "max_time_ms": cap, "result": str(tmp / "result.json"), "backend_options": backend_options or {},
               "cases": [{"spec": c.spec.to_dict(), "backend": c.backend, "iterations": c.iterations} for c in cases]}
        (tmp / "job.json").write_text(json.dumps(job))
        child = child_command(tmp / "job.json")
        if tool == "ncu":
            cmd = ncu_mod.ncu_command(child, ncu=exe)
        elif tool == "nsys":
            cmd = nsys_mod.profile_command(child, tmp / "trace", nsys=exe)
        else:
            cmd = rocprof_mod.rocprof_command(child, tmp / "out", rocprof=exe)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
        if proc.returncode != 0 or not (tmp / "result.json").exists():
            raise RuntimeError(f"{TOOLS[tool]} run failed (exit {proc.returncode}): {_last_line(proc.stderr or proc.stdout)}")
        reported = json.loads((tmp / "result.json").read_text())
        ran = [r.get("iterations", c.iterations) for c, r in zip(cases, reported) if "error" not in r]
        kernels = _kernels(tool, proc.stdout, tmp, exe, timeout_s) if ran else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    blocks = iter(split_marked(kernels, ran, cold=cold) if ran else [])
    out: list[Profiled | CaseFailed] = []
    for extra in reported:
        if "error" in extra:
            out.append(CaseFailed(f"the profiled re-run: {extra['error']}"))
            continue
        calls = next(blocks)
        info = {"kernels": kernel_names(calls), "kernel_ms": kernel_times_ms(calls),
                "kernels_per_call": int(statistics.median(len(c) for c in calls)),
                "kernel_source": tool, "profiler_cold_l2": "ncu --cache-control all" if tool == "ncu" else cold}
        out.append((iteration_times_ms(calls), info | {"child_info": extra.get("info", {})}))
    return out


class ProfileSessions:
    """``--profiler ncu|nsys|rocprof`` over a sweep: one profiler process for many cases, not one per case.

    A profiler run costs seconds before the first kernel (the profiler, Python, torch, the backends' imports)
    and after the last (nsys writes and exports its report). When the runner reaches a case not yet profiled,
    that case and the next ones of the run (up to ``batch``) are profiled in one child, each inside its own
    timed range; their results wait here until the runner reaches them. nsys takes the next cases of any
    backend, so a sweep over many kernels pays its start once per ``batch`` cases; ncu and rocprof take the
    next cases of the same backend (a process per backend), so a kernel that brings its process down costs only
    its own cases a second try. A case that fails in the child fails alone (its record says why). When the
    child fails as a whole (a crash, an unreadable trace) its cases are profiled one at a time, each in its own
    process, so one bad case cannot take the others' times. Each record carries ``profiler_session``: how many
    cases shared the process and its wall time."""

    def __init__(self, tool: str, cases: list[tuple[AttnSpec, str]], *, iterations: int, device: str,
                 seed: int = 0, warmup: int = 5, cold_l2: bool = True, inputs: dict | None = None,
                 batch: int = 32, max_time_ms: float | None = None, stopped=lambda: False,
                 backend_options: dict | None = None):
        self.tool, self.iterations, self.batch, self.stopped = tool, iterations, max(1, batch), stopped
        self.options = {"device": device, "seed": seed, "warmup": warmup, "cold_l2": cold_l2, "inputs": inputs,
                        "max_time_ms": max_time_ms, "backend_options": backend_options}
        self.any_backend = tool == "nsys"
        """Whether one process takes cases of several backends (nsys), or of one (ncu, rocprof)."""
        self.pending: dict[str, list[tuple[str, AttnSpec]]] = {}
        """The (backend, spec) cases not profiled yet, in the run's order, per group (a backend, or all)."""
        for spec, backend in cases:
            self.pending.setdefault(self._group(backend), []).append((backend, spec))
        self.done: dict[tuple[str, AttnSpec], Profiled | Exception] = {}
        self.alone: set[tuple[str, AttnSpec]] = set()
        """Cases of a failed session: each is profiled in its own process when the runner reaches it."""

    def _group(self, backend: str) -> str:
        return "" if self.any_backend else backend

    def measure(self, spec: AttnSpec, backend: str) -> Profiled:
        """The case's samples and info (profiling it, and the next cases, if it is not done yet)."""
        key = (backend, spec)
        if key not in self.done:
            self._profile(key)
        result = self.done.pop(key)
        if isinstance(result, Exception):
            raise result
        return result

    def _profile(self, key: tuple[str, AttnSpec]) -> None:
        queue = self.pending.get(self._group(key[0]), [])
        if key in queue:
            queue.remove(key)
        batch = [key]
        while key not in self.alone and queue and len(batch) < self.batch:
            case = queue.pop(0)
            if case not in self.alone:  # a case of a failed session waits for its turn, alone
                batch.append(case)
        started = time.perf_counter()
        try:
            results = run_external(self.tool, [ExternalCase(spec=s, backend=b, iterations=self.iterations)
                                               for b, s in batch], timeout_s=900 + 120 * (len(batch) - 1), **self.options)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            if self.stopped():  # Ctrl-C reached the profiler too: this case ends with the run, not as an error
                raise KeyboardInterrupt from exc
            if len(batch) == 1:
                raise
            backends = ", ".join(dict.fromkeys(b for b, _ in batch))
            log.warning("%s session of %d cases (%s) failed (%s); profiling them one at a time", self.tool,
                        len(batch), backends, _last_line(str(exc)))
            self.alone.update(batch)
            self._profile(key)
            return
        wall = time.perf_counter() - started
        session = {"cases": len(batch), "wall_s": round(wall, 2), "per_case_s": round(wall / len(batch), 2)}
        for case, result in zip(batch, results):
            self.done[case] = result if isinstance(result, Exception) else (result[0], result[1] | {
                "profiler_session": session})
        # the child stopped early (a failure left its CUDA context unusable): the cases after it run each on
        # their own when the runner reaches them
        self.alone.update(batch[len(results):])


def _kernels(tool: str, stdout: str, tmp: Path, exe: str, timeout_s: float):
    """The ordered (name, ms) kernel list of the profiled child."""
    if tool == "ncu":
        return ncu_mod.parse_ncu_csv(stdout)
    if tool == "rocprof":
        return rocprof_mod.parse_outputs(tmp / "out")
    report = tmp / "trace.nsys-rep"
    stats = subprocess.run(nsys_mod.stats_command(report, tmp / "trace", nsys=exe), capture_output=True, text=True,
                           timeout=timeout_s)
    if stats.returncode != 0:
        raise RuntimeError(f"nsys stats failed (exit {stats.returncode}): {_last_line(stats.stderr or stats.stdout)}")
    return nsys_mod.parse_outputs(tmp, "trace")

"""Re-run cases under an external profiler (ncu, nsys, rocprofv3) in a subprocess and read kernel times.

The parent writes a job file for ``attnbench.timing.child``, runs it under the profiler, parses the
profiler's output into an ordered kernel list and cuts it into calls (``marked.py``). Each sample
is the summed device duration of one call's kernels; the info names the kernels.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import attnbench
from attnbench.spec import AttnSpec
from attnbench.timing import ncu as ncu_mod
from attnbench.timing import nsys as nsys_mod
from attnbench.timing import rocprof as rocprof_mod
from attnbench.timing.marked import iteration_times_ms, kernel_names, kernel_times_ms, split_marked

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
    src = str(Path(attnbench.__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def run_external(tool: str, cases: list[ExternalCase], *, device: str, seed: int = 0, warmup: int = 5,
                 cold_l2: bool = True, timeout_s: float = 900, inputs: dict | None = None) -> list[tuple[list[float], dict]]:
    """(samples_ms, info) per case, measured under ``tool`` in one child process (``inputs``: how the
    inputs are drawn, ``InputDist.describe()``; None = N(0, 1))."""
    exe = find_tool(tool)
    if exe is None:
        raise FileNotFoundError(f"{TOOLS[tool]} is not installed or not on PATH")
    cold = cold_l2 and tool != "ncu"  # ncu flushes caches before every profiled kernel itself
    with tempfile.TemporaryDirectory(prefix="attnbench-") as tmp:
        tmp = Path(tmp)
        job = {"device": device, "seed": seed, "inputs": inputs, "warmup": warmup, "cold_l2": cold,
               "result": str(tmp / "result.json"),
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
        kernels = _kernels(tool, proc.stdout, tmp, exe, timeout_s)
        child_info = json.loads((tmp / "result.json").read_text())
    blocks = split_marked(kernels, [c.iterations for c in cases], cold=cold)
    out = []
    for calls, extra in zip(blocks, child_info, strict=True):
        info = {"kernels": kernel_names(calls), "kernel_ms": kernel_times_ms(calls),
                "kernels_per_call": int(statistics.median(len(c) for c in calls)),
                "kernel_source": tool, "profiler_cold_l2": "ncu --cache-control all" if tool == "ncu" else cold}
        out.append((iteration_times_ms(calls), info | {"child_info": extra.get("info", {})}))
    return out


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

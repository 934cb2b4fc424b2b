"""Nsight Systems: command lines and parsing of the kernel trace (``--profiler nsys``).

Like ncu and rocprofv3 (``external.py``), the case runs again in a child process, here under
``nsys profile --trace=cuda,nvtx``; ``nsys stats`` then exports two reports as CSV:
``cuda_gpu_trace`` (every kernel and copy on the device, with start and duration in ns) and
``nvtx_pushpop_trace`` (the child's ranges). The kernels that start and end inside the child's range
``attnbench_timed`` are the timed ones (the child synchronises before closing it), in start order;
copies and memsets are not kernels and are left out, as ncu leaves them out.

Unlike ncu, nsys does not replay kernels or touch the clocks: its times are those of a plain run
with the CUPTI timestamps, so they sit close to CUDA events (no launch gaps inside a call's kernels).
Needs nsys and, on the GPU machines here, libdw (see docs/guide.md).
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from attnbench.timing.marked import TIMED_RANGE, Kernel

REPORTS = ("cuda_gpu_trace", "nvtx_pushpop_trace")


def find_nsys() -> str | None:
    return shutil.which("nsys")


def profile_command(child: list[str], report_base: str | Path, *, nsys: str = "nsys") -> list[str]:
    """nsys invocation tracing CUDA and NVTX of ``child`` (a command line) into ``report_base``.nsys-rep."""
    return [nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
            "--output", str(report_base), *child]


def stats_command(report_file: str | Path, out_base: str | Path, *, nsys: str = "nsys") -> list[str]:
    """nsys stats writing one CSV per report in REPORTS, named ``<out_base>_<report>.csv``."""
    reports = [arg for name in REPORTS for arg in ("--report", name)]
    return [nsys, "stats", "--force-export=true", *reports, "--format", "csv", "--output", str(out_base),
            str(report_file)]


def _table(text: str, needed: str) -> list[dict]:
    """The CSV table of an nsys stats file (its notes before the header skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if needed in line), None)
    if start is None:
        raise ValueError(f"no {needed!r} column in the nsys stats output")
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _ns(row: dict, key: str) -> int:
    return int(float(str(row[key]).replace(",", "")))


def timed_windows(nvtx_csv: str, range_name: str = TIMED_RANGE) -> list[tuple[int, int]]:
    """(start, end) ns of every instance of the NVTX range ``range_name``."""
    rows = _table(nvtx_csv, "Start (ns)")
    return [(_ns(r, "Start (ns)"), _ns(r, "End (ns)")) for r in rows if (r.get("Name") or "").lstrip(":") == range_name]


def parse_gpu_trace(trace_csv: str, windows: list[tuple[int, int]] | None = None) -> list[Kernel]:
    """(kernel name, ms) of the kernels inside ``windows`` (all if None), in start order; copies and
    memsets (names in brackets, ``[CUDA memcpy ...]``) are not kernels."""
    out = []
    for r in _table(trace_csv, "Duration (ns)"):
        name = r.get("Name") or ""
        if not name or name.startswith("[CUDA mem"):
            continue
        start, dur = _ns(r, "Start (ns)"), _ns(r, "Duration (ns)")
        if windows is not None and not any(lo <= start and start + dur <= hi for lo, hi in windows):
            continue
        out.append((start, name, dur / 1e6))
    if not out:
        raise ValueError("no kernels in the nsys trace" + (" inside the timed range" if windows else ""))
    out.sort(key=lambda k: k[0])
    return [(name, ms) for _, name, ms in out]


def parse_outputs(out_dir: str | Path, base_name: str, range_name: str = TIMED_RANGE) -> list[Kernel]:
    """The timed kernels from the CSV files ``nsys stats`` wrote for ``base_name`` in ``out_dir``."""
    out_dir = Path(out_dir)
    found = {name: sorted(out_dir.glob(f"{base_name}*{name}*.csv")) for name in REPORTS}
    missing = [name for name, paths in found.items() if not paths]
    if missing:
        raise FileNotFoundError(f"nsys stats wrote no {', '.join(missing)} CSV in {out_dir}")
    windows = timed_windows(found["nvtx_pushpop_trace"][0].read_text(), range_name)
    if not windows:
        raise ValueError(f"the NVTX trace has no range {range_name!r}")
    return parse_gpu_trace(found["cuda_gpu_trace"][0].read_text(), windows)

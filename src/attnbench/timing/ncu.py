"""Nsight Compute: command line and parsing of ``--csv`` output (``gpu__time_duration.sum`` per kernel).

Not-default choices, and why:
- ``--clock-control none``: ncu locks clocks to base by default, which makes kernels slower than
  in a real run; we want the clocks the events timer sees.
- ``--nvtx --nvtx-include attnbench_timed/``: the kernel filter. Only kernels launched inside the
  child's timed range are profiled (no warm-up, no preparation, no allocator fills). ncu flushes
  all caches before each profiled kernel (``--cache-control all``), so the child launches no L2
  flush of its own under ncu.
- ``--print-units base``: durations always in nanoseconds, whatever their size.
"""

from __future__ import annotations

import csv

from attnbench.timing.marked import TIMED_RANGE, Kernel

METRIC = "gpu__time_duration.sum"
# Unit of the metric value -> milliseconds.
UNIT_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
           "second": 1e3, "s": 1e3}


def ncu_command(child: list[str], *, ncu: str = "ncu", range_name: str = TIMED_RANGE) -> list[str]:
    """The ncu invocation profiling ``child`` (a command line) for the duration of every timed kernel."""
    return [ncu, "--clock-control", "none", "--cache-control", "all", "--metrics", METRIC, "--csv",
            "--print-units", "base", "--print-kernel-base", "demangled", "--nvtx", "--nvtx-include",
            f"{range_name}/", "--target-processes", "all", *child]


def _number(text: str) -> float:
    return float(str(text).replace(",", "").strip())


def parse_ncu_csv(text: str, metric: str = METRIC) -> list[Kernel]:
    """(kernel name, ms) per profiled kernel, in launch order, from ``ncu --csv`` stdout.

    Tolerates ncu's own ``==PROF==``/``==WARNING==`` lines and the program's output around the table.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV table in the output (did ncu profile any kernel?)")
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = []
    for row in csv.DictReader(table):
        if row.get("Metric Name") != metric:
            continue
        unit = (row.get("Metric Unit") or "").strip()
        if unit not in UNIT_MS:
            raise ValueError(f"unknown unit {unit!r} for {metric}")
        rows.append((int(_number(row["ID"])), row["Kernel Name"], _number(row["Metric Value"]) * UNIT_MS[unit]))
    if not rows:
        raise ValueError(f"ncu output has no {metric} values")
    rows.sort(key=lambda r: r[0])
    return [(name, ms) for _, name, ms in rows]

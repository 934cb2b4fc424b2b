"""rocprofv3 (ROCm): command line and parsing of its CSV kernel and marker traces.

The child's roctx range ``attnbench_timed`` (torch.cuda.nvtx maps to roctx on ROCm) is read from
the marker trace; kernels that started and ended inside it are the timed ones, in start order.
Written against the documented rocprofv3 CSV format (ROCm 6.2+); not run on hardware here.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from attnbench.timing.marked import TIMED_RANGE, Kernel

OUTPUT_NAME = "attnbench"


def rocprof_command(child: list[str], out_dir: str | Path, *, rocprof: str = "rocprofv3") -> list[str]:
    """rocprofv3 invocation tracing kernels and roctx ranges of ``child`` into CSV files in ``out_dir``."""
    return [rocprof, "--kernel-trace", "--marker-trace", "--output-format", "csv", "-d", str(out_dir),
            "-o", OUTPUT_NAME, "--", *child]


def find_outputs(out_dir: str | Path) -> tuple[Path, Path | None]:
    """The kernel trace and marker trace CSVs rocprofv3 wrote somewhere under ``out_dir``."""
    out_dir = Path(out_dir)
    kernels = sorted(out_dir.rglob("*kernel_trace.csv"))
    if not kernels:
        raise FileNotFoundError(f"rocprofv3 wrote no *kernel_trace.csv under {out_dir}")
    markers = sorted(out_dir.rglob("*marker_api_trace.csv"))
    return kernels[0], (markers[0] if markers else None)


def timed_window(marker_csv: str, range_name: str = TIMED_RANGE) -> list[tuple[int, int]]:
    """(start, end) ns of every instance of the roctx range ``range_name``."""
    return [(int(r["Start_Timestamp"]), int(r["End_Timestamp"]))
            for r in csv.DictReader(io.StringIO(marker_csv)) if r.get("Function") == range_name]


def parse_kernel_trace(kernel_csv: str, windows: list[tuple[int, int]] | None = None) -> list[Kernel]:
    """(kernel name, ms) of the kernels inside ``windows`` (all kernels if None), in start order."""
    rows = []
    for r in csv.DictReader(io.StringIO(kernel_csv)):
        start, end = int(r["Start_Timestamp"]), int(r["End_Timestamp"])
        if windows is not None and not any(lo <= start and end <= hi for lo, hi in windows):
            continue
        rows.append((start, r["Kernel_Name"], (end - start) / 1e6))
    if not rows:
        raise ValueError("no kernels in the rocprofv3 trace" + (" inside the timed range" if windows else ""))
    rows.sort(key=lambda r: r[0])
    return [(name, ms) for _, name, ms in rows]


def parse_outputs(out_dir: str | Path, range_name: str = TIMED_RANGE) -> list[Kernel]:
    """Timed kernels from a rocprofv3 output directory."""
    kernel_path, marker_path = find_outputs(out_dir)
    if marker_path is None:
        raise FileNotFoundError(f"rocprofv3 wrote no marker trace under {out_dir}; was --marker-trace given?")
    from attnbench.results.files import MAX_TRACE_BYTES, read_text
    windows = timed_window(read_text(marker_path, MAX_TRACE_BYTES, "rocprofv3 marker trace"), range_name)
    if not windows:
        raise ValueError(f"the marker trace has no range {range_name!r}")
    return parse_kernel_trace(read_text(kernel_path, MAX_TRACE_BYTES, "rocprofv3 kernel trace"), windows)

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
    from attnbench.results.files import MAX_TRACE_BYTES, read_text
    windows = timed_windows(read_text(found["nvtx_pushpop_trace"][0], MAX_TRACE_BYTES, "nsys NVTX trace"), range_name)
    if not windows:
        raise ValueError(f"the NVTX trace has no range {range_name!r}")
    return parse_gpu_trace(read_text(found["cuda_gpu_trace"][0], MAX_TRACE_BYTES, "nsys kernel trace"), windows)


# ---- kernels per NVTX range, from the SQLite export of a profile (``nsys export --type sqlite``) -------------

def _tables(con) -> set[str]:
    return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def launches_in_ranges(sqlite_path: str | Path) -> list[dict]:
    """Every device kernel of a profile with the NVTX ranges open on the host thread that launched it.

    Kernels (``CUPTI_ACTIVITY_KIND_KERNEL``) are joined to the runtime or driver API call that launched
    them by correlation id; a kernel belongs to every push/pop range (``NVTX_EVENTS``) of the launching
    thread that contains the launch call's start. This is how nsys itself attributes work to ranges: by
    where the host code launched it, not by when the device ran it (that is later, asynchronously).
    Returns dicts ``{name, ms, ranges}`` in launch order; ``ranges``: (range name, range start ns),
    outermost first (the start tells apart two ranges of one name)."""
    import sqlite3

    con = sqlite3.connect(f"file:{Path(sqlite_path)}?mode=ro", uri=True)
    try:
        tables = _tables(con)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            raise ValueError("the profile has no CUDA kernels (was it taken with --trace=cuda?)")
        api = [t for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER") if t in tables]
        launches = " UNION ALL ".join(f"SELECT correlationId, start, globalTid FROM {t}" for t in api)
        rows = con.execute(
            "SELECT s.value, k.end - k.start, a.start, a.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            f"JOIN ({launches}) a ON a.correlationId = k.correlationId "
            "JOIN StringIds s ON s.id = k.demangledName ORDER BY a.start").fetchall()
        ranges: dict[int, list[tuple[int, int, str]]] = {}
        if "NVTX_EVENTS" in tables:
            text = "COALESCE(e.text, (SELECT value FROM StringIds WHERE id = e.textId))"
            for start, end, name, tid in con.execute(
                    f"SELECT e.start, e.end, {text}, e.globalTid FROM NVTX_EVENTS e "
                    "WHERE e.end IS NOT NULL AND e.eventType = 59 ORDER BY e.start"):  # 59: push/pop range
                ranges.setdefault(tid, []).append((start, end, name or ""))
    finally:
        con.close()
    out = []
    for name, dur_ns, launched, tid in rows:
        inside = [(n, lo) for lo, hi, n in ranges.get(tid, ()) if lo <= launched <= hi]
        out.append({"name": name, "ms": dur_ns / 1e6, "ranges": inside})
    return out


def step_summary(kernels: list[dict], *, step_prefix: str = "step", attn_prefix: str = "attn") -> list[dict]:
    """Per NVTX step range (``step0``, ``step1``, ... as ``attnbench e2e`` marks its timed steps): the
    backend whose ``attn:<backend>`` ranges it holds, its kernel count and time, the attention kernels'
    time (those launched inside an ``attn:`` or ``attn-bwd:`` range), and the kernel tallies of the
    CogVideoX-2b write-up's table (``KERNEL_TALLIES``). Steps in profile order."""
    from attnbench.models.bench import KERNEL_TALLIES

    steps: dict[tuple[str, int], dict] = {}
    for k in kernels:
        step = next((r for r in k["ranges"] if r[0].startswith(step_prefix) and r[0][len(step_prefix):].isdigit()),
                    None)
        if step is None:
            continue
        attn = next((n for n, _ in k["ranges"] if n.split(":", 1)[0] in (attn_prefix, f"{attn_prefix}-bwd")), None)
        row = steps.get(step)
        if row is None:
            row = steps[step] = {"step": step[0], "start_ns": step[1], "backend": None, "kernels": 0,
                                 "kernels_ms": 0.0, "attn_kernels": 0, "attn_ms": 0.0}
            for tally in KERNEL_TALLIES:
                row[f"{tally}_kernels"], row[f"{tally}_ms"] = 0, 0.0
        row["kernels"] += 1
        row["kernels_ms"] += k["ms"]
        if attn is not None:
            row["backend"] = row["backend"] or attn.split(":", 1)[1]
            row["attn_kernels"] += 1
            row["attn_ms"] += k["ms"]
        for tally, pattern in KERNEL_TALLIES.items():
            if pattern in k["name"]:
                row[f"{tally}_kernels"] += 1
                row[f"{tally}_ms"] += k["ms"]
    return sorted(steps.values(), key=lambda r: r["start_ns"])

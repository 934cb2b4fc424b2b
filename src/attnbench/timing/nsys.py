"""Nsight Systems: re-run a whole ``attnbench run`` under nsys and report time per NVTX range.

The runner opens an NVTX range around every case (``backend label pass``) and its phases
(prepare, check, timing); ``nsys stats`` turns the report into per-range times: ``nvtx_gpu_proj_sum``
(GPU time projected onto each range) and ``nvtx_sum`` (CPU wall time of each range).
Command composition and parsing are unit-tested; nsys itself is not installed on the GPU machine
these were developed against, so the end-to-end path is not run on hardware here.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

REPORTS = ("nvtx_gpu_proj_sum", "nvtx_sum")


def find_nsys() -> str | None:
    return shutil.which("nsys")


def strip_profiler_args(argv: list[str]) -> list[str]:
    """argv without ``--profiler X`` / ``--profiler=X`` (the child run must not re-exec itself)."""
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--profiler":
            skip = True
        elif not tok.startswith("--profiler="):
            out.append(tok)
    return out


def profile_command(argv: list[str], report_base: str | Path, *, nsys: str = "nsys") -> list[str]:
    """nsys invocation of ``attnbench <argv> --profiler none`` tracing CUDA and NVTX into ``report_base``."""
    return [nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
            "--output", str(report_base), sys.executable, "-m", "attnbench", *strip_profiler_args(argv),
            "--profiler", "none"]


def stats_command(report_file: str | Path, out_base: str | Path, *, nsys: str = "nsys") -> list[str]:
    """nsys stats writing one CSV per report in REPORTS, named ``<out_base>_<report>.csv``."""
    reports = [arg for name in REPORTS for arg in ("--report", name)]
    return [nsys, "stats", "--force-export=true", *reports, "--format", "csv", "--output", str(out_base),
            str(report_file)]


def _ms(row: dict, *keys: str) -> float | None:
    for key in keys:
        if row.get(key) not in (None, ""):
            return float(str(row[key]).replace(",", "")) / 1e6
    return None


def parse_stats_csv(text: str) -> list[dict]:
    """Rows of an nvtx_sum or nvtx_gpu_proj_sum CSV: range, instances, total/avg/median ms."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Range" in line.split(",") or '"Range"' in line), None)
    if start is None:
        raise ValueError("no NVTX summary table (no 'Range' column) in the nsys stats output")
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("Range"):
            continue
        instances = row.get("Range Instances") or row.get("Instances") or "0"
        out.append({"range": row["Range"].lstrip(":"), "instances": int(float(instances.replace(",", ""))),
                    "total_ms": _ms(row, "Total Proj Time (ns)", "Total Time (ns)"),
                    "avg_ms": _ms(row, "Proj Avg (ns)", "Avg (ns)"),
                    "med_ms": _ms(row, "Proj Med (ns)", "Med (ns)")})
    return out


def merge(gpu_rows: list[dict], cpu_rows: list[dict]) -> list[dict]:
    """One row per range: GPU projected total/avg ms beside CPU range avg ms."""
    cpu = {r["range"]: r for r in cpu_rows}
    rows = []
    for r in gpu_rows:
        c = cpu.get(r["range"], {})
        rows.append({"range": r["range"], "instances": r["instances"], "gpu_total_ms": r["total_ms"],
                     "gpu_avg_ms": r["avg_ms"], "range_avg_ms": c.get("avg_ms")})
    seen = {r["range"] for r in rows}
    rows += [{"range": c["range"], "instances": c["instances"], "gpu_total_ms": None, "gpu_avg_ms": None,
              "range_avg_ms": c["avg_ms"]} for c in cpu_rows if c["range"] not in seen]
    return rows


def run_under_nsys(argv: list[str], out_dir: str | Path, *, nsys: str | None = None,
                   timeout_s: float | None = None) -> tuple[list[dict], Path]:
    """Re-run ``attnbench <argv>`` under nsys; per-range rows and the report file."""
    nsys = nsys or find_nsys()
    if nsys is None:
        raise FileNotFoundError("nsys (Nsight Systems) is not installed or not on PATH")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / "attnbench"
    done = subprocess.run(profile_command(argv, base, nsys=nsys), timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the run under nsys failed with exit status {done.returncode}")
    report = base.with_suffix(".nsys-rep")
    stats = subprocess.run(stats_command(report, base, nsys=nsys), capture_output=True, text=True, timeout=timeout_s)
    if stats.returncode != 0:
        raise RuntimeError(f"nsys stats failed: {(stats.stderr or stats.stdout).strip().splitlines()[-1:]}")
    tables = {}
    for name in REPORTS:
        found = sorted(out_dir.glob(f"{base.name}*{name}*.csv"))
        tables[name] = parse_stats_csv(found[0].read_text()) if found else []
    return merge(tables["nvtx_gpu_proj_sum"], tables["nvtx_sum"]), report

"""The CogVideoX-2b write-up's "CUDA GPU Kernel Summary" rows from an Nsight Systems profile, beside what
attnbench's own torch-profiler kernel counts (``e2e --kernel-counts``) give for a step of the same model.

    python3 benchmarks/e2e_nsys.py --out DIR [--model cogvideox-2b] [--backends fa2,sage,...] [--steps 2]

1. ``nsys profile --trace=cuda,nvtx`` over ``attnbench e2e`` (every backend in one process; each timed step
   is an NVTX range ``step<i>``, each attention call a range ``attn:<backend>`` inside it);
2. ``nsys export --type sqlite``; per step, the kernels launched inside it, the attention kernels (launched
   inside an ``attn:`` range), ``direct_copy_kernel_cuda`` and ``CUDAFunctor_add`` counts and times
   (``attnbench.timing.nsys.step_summary``), averaged over a backend's steps;
3. ``attnbench e2e --kernel-counts`` again without nsys: its step timing (CUDA events) and its torch-profiler
   count of one more step.

Writes DIR/kernel_summary.md (and the profile, its SQLite export, the two e2e stores and logs) and prints the table.
The write-up's totals are of its whole run (warm-up and 50 steps); these rows are per denoising step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from attnbench.results.store import ResultStore  # noqa: E402
from attnbench.timing.nsys import launches_in_ranges, step_summary  # noqa: E402


def sh(cmd: list[str], log: Path) -> None:
    with open(log, "w") as fh:
        done = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-5:]
        raise SystemExit(f"{cmd[0]} {cmd[1]} failed (exit {done.returncode}); {log}:\n" + "\n".join(tail))


def per_backend(steps: list[dict]) -> dict[str, dict]:
    """Mean of each numeric field over a backend's steps."""
    out: dict[str, dict] = {}
    for backend in dict.fromkeys(s["backend"] for s in steps if s["backend"]):
        mine = [s for s in steps if s["backend"] == backend]
        out[backend] = {k: statistics.fmean(s[k] for s in mine) for k, v in mine[0].items()
                        if isinstance(v, (int, float)) and k != "start_ns"} | {"steps": len(mine)}
    return out


def table(nsys: dict[str, dict], records: dict, backends: list[str]) -> str:
    cols = [b for b in backends if b in nsys or b in records]
    rows = []

    def add(label, values):
        rows.append(f"| {label} | " + " | ".join(values) + " |")

    def ns(key, fmt, scale=1.0):
        return [format(nsys[b][key] * scale, fmt) if b in nsys else "-" for b in cols]

    def recorded(where, key, fmt, scale=1.0):
        """A value of each backend's e2e record: ``where`` picks the dict (counts or step timings)."""
        out = []
        for b in cols:
            value = where(records[b]).get(key) if b in records else None
            out.append("-" if value is None else format(value * scale if scale != 1.0 else value, fmt))
        return out

    def tp(key, fmt, scale=1.0):
        return recorded(lambda r: r.info.get("e2e", {}).get("kernel_counts") or {}, key, fmt, scale)

    def ev(key, fmt, scale=1.0):
        return recorded(lambda r: r.info.get("e2e", {}), key, fmt, scale)

    add("Metrics (per denoising step)", cols)
    add("---", ["---:"] * len(cols))
    add("**nsys**: Attn (%) of kernel time", [f"{nsys[b]['attn_ms'] / nsys[b]['kernels_ms']:.1%}" if b in nsys else "-"
                                            for b in cols])
    add("nsys: Attn (s)", ns("attn_ms", ".3f", 1e-3))
    add("nsys: attention kernels (times)", ns("attn_kernels", ".0f"))
    add("nsys: direct_copy_kernel_cuda (times)", ns("copy_kernels", ",.0f"))
    add("nsys: direct_copy_kernel_cuda (ms)", ns("copy_ms", ".1f"))
    add("nsys: CUDAFunctor_add (times)", ns("add_kernels", ",.0f"))
    add("nsys: CUDAFunctor_add (ms)", ns("add_ms", ".1f"))
    add("nsys: kernels (times)", ns("kernels", ",.0f"))
    add("nsys: Total kernel time (s)", ns("kernels_ms", ".3f", 1e-3))
    add("**torch profiler** (`--kernel-counts`): direct_copy_kernel_cuda (times)", tp("copy_kernels", ",d"))
    add("torch profiler: direct_copy_kernel_cuda (ms)", tp("copy_ms", ".1f"))
    add("torch profiler: CUDAFunctor_add (times)", tp("add_kernels", ",d"))
    add("torch profiler: CUDAFunctor_add (ms)", tp("add_ms", ".1f"))
    add("torch profiler: kernels (times)", tp("kernels", ",d"))
    add("torch profiler: kernel time (s)", tp("kernels_ms", ".3f", 1e-3))
    add("**CUDA events** (attnbench e2e): Attn (%)", ev("attn_share", ".1%"))
    add("events: Attn (s)", ev("attn_ms", ".3f", 1e-3))
    add("events: Total (s)", ev("total_ms", ".3f", 1e-3))
    return "\n".join(rows)


def summarize(sqlite: Path, db: Path, backends: list[str]) -> str:
    steps = step_summary(launches_in_ranges(sqlite))
    with ResultStore(db) as store:
        records = {r.backend: r for r in store.records()}
    return table(per_backend(steps), records, backends)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="cogvideox-2b")
    parser.add_argument("--backends", default="fa2,sage,sparge-fp16,sparge,sdpa-flash,sdpa-cudnn,fa3")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    nsys = shutil.which("nsys")
    if nsys is None:
        raise SystemExit("nsys not on PATH (see docs/guide.md: 'Nsight Systems on the GPU machines here')")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    e2e = [sys.executable, "-m", "attnbench", "e2e", "--model", args.model, "--backends", args.backends,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--skip-missing"]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    report = out / "e2e"
    sh([nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
        "--output", str(report), *e2e, "--db", str(out / "e2e-nsys.db")], out / "nsys-profile.log")
    sh([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", f"{report}.sqlite",
        f"{report}.nsys-rep"], out / "nsys-export.log")
    db = out / "e2e-kernel-counts.db"
    db.unlink(missing_ok=True)
    sh([*e2e, "--kernel-counts", "--db", str(db)], out / "e2e-kernel-counts.log")
    text = summarize(Path(f"{report}.sqlite"), db, args.backends.split(","))
    (out / "kernel_summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

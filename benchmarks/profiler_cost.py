"""What an external profiler costs a sweep: the same cases timed by events, and by nsys and ncu with many cases
in one profiler process (the default: nsys any backend's, ncu one backend's) and with a process per case.

    python3 benchmarks/profiler_cost.py --out DIR [--backends fa2,fa3,sdpa-cudnn] [--seq-lens 1k 4k 16k]
                                        [--modes events,nsys,nsys-1,ncu,ncu-1] [-- EXTRA RUN FLAGS]

Each mode is one ``attnbench run`` into its own store under DIR (``--no-check``: the profilers time, they do not
check); the wall time of each command is measured around it. Prints a markdown table: cases ok, wall seconds,
seconds per case, the cost against the events sweep, and, for the batched modes, how far each case's median
moved from the same profiler with a process per case (the largest and the median move, in %).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnbench.results.store import ResultStore

MODES = {"events": [], "nsys": ["--profiler", "nsys"], "nsys-1": ["--profiler", "nsys", "--profiler-batch", "1"],
         "ncu": ["--profiler", "ncu"], "ncu-1": ["--profiler", "ncu", "--profiler-batch", "1"]}


def run_mode(mode: str, out: Path, sweep: list[str]) -> tuple[float, dict[str, float], int]:
    """Wall seconds of the run, median ms per case (keyed without the timing mode), and records."""
    db = out / f"{mode}.db"
    db.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "attnbench", "run", *sweep, *MODES[mode], "--no-check", "--quiet", "--db", str(db)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (out / f"{mode}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{mode}: attnbench run exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    with ResultStore(db, create=False) as store:
        records = store.records(store.latest_run_id())
    medians = {f"{r.backend} {r.spec.label()} {r.spec.pass_}": r.median_ms for r in records if r.status == "ok"}
    return wall, medians, len(records)


def moved(batched: dict[str, float], alone: dict[str, float]) -> tuple[float, float] | None:
    """Largest and median |change| in % of the cases timed both ways."""
    both = [abs(batched[k] / alone[k] - 1) * 100 for k in batched.keys() & alone.keys() if alone[k]]
    return (max(both), statistics.median(both)) if both else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backends", default="fa2,fa3,sdpa-cudnn")
    ap.add_argument("--seq-lens", nargs="+", default=["1k", "4k", "16k"])
    ap.add_argument("--modes", default="events,nsys,nsys-1,ncu,ncu-1")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; allowed: {', '.join(MODES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = ["--backends", args.backends, "--seq-lens", *args.seq_lens, *extra]
    results = {}
    for mode in modes:
        results[mode] = run_mode(mode, args.out, sweep)
        wall, medians, n = results[mode]
        print(f"{mode}: {len(medians)}/{n} cases ok in {wall:.1f} s", file=sys.stderr, flush=True)
    events_wall = results["events"][0] if "events" in results else None
    print(f"attnbench run {' '.join(sweep)} (`--no-check`), each mode in a process of its own\n")
    print("| mode | cases ok | wall s | s per case | x events | moved vs a process per case (max / median %) |")
    print("|---|---:|---:|---:|---:|---|")
    for mode, (wall, medians, n) in results.items():
        ratio = f"{wall / events_wall:.1f}" if events_wall else "-"
        alone = results.get(f"{mode}-1")
        move = moved(medians, alone[1]) if alone and not mode.endswith("-1") else None
        shift = f"{move[0]:.2f} / {move[1]:.2f}" if move else "-"
        print(f"| {mode} | {len(medians)}/{n} | {wall:.1f} | {wall / max(n, 1):.2f} | {ratio} | {shift} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a run's wall time went, per backend and phase, from the records' ``info["wall_s"]``.

    python3 benchmarks/sweep_cost.py results.db [RUN_ID]     # default: the latest run

Prints a markdown table: one row per backend with its cases, the seconds spent preparing
(kernel setup), compiling (torch.compile), checking (reference + comparison) and timing (warm-up,
samples, statistics), and the samples taken; then the ten most expensive cases.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from attnbench.results.store import ResultStore

PHASES = ("prepare", "compile", "check", "timing")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("run_id", nargs="?")
    args = ap.parse_args(argv)
    with ResultStore(args.db, create=False) as store:
        run_id = args.run_id or store.latest_run_id()
        if run_id is None:
            print(f"{args.db}: no runs", file=sys.stderr)
            return 2
        records = store.records(run_id)
    per_backend: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    cases = []
    for r in records:
        wall = r.info.get("wall_s") or {}
        row = per_backend[r.backend]
        row["cases"] += 1
        row["samples"] += r.n or 0
        for phase in PHASES:
            row[phase] += wall.get(phase, 0.0)
        cases.append((sum(wall.get(p, 0.0) for p in PHASES), r))
    print(f"run {run_id}: {len(records)} records\n")
    print("| backend | cases | " + " | ".join(f"{p} s" for p in PHASES) + " | total s | samples |")
    print("|---|---:|" + "---:|" * (len(PHASES) + 2))
    totals = defaultdict(float)
    for name, row in sorted(per_backend.items(), key=lambda kv: -sum(kv[1][p] for p in PHASES)):
        for key, value in row.items():
            totals[key] += value
        print(_row(name, row))
    print(_row("**all**", totals))
    print("\nmost expensive cases:\n")
    for seconds, r in sorted(cases, key=lambda c: -c[0])[:10]:
        wall = ", ".join(f"{k} {v:.2f}" for k, v in (r.info.get("wall_s") or {}).items())
        median = f"{r.median_ms:.3f} ms" if r.median_ms is not None else r.status
        print(f"- {seconds:6.2f} s  {r.backend} {r.spec.label()} {r.spec.pass_}: {median} x {r.n or 0} ({wall})")
    return 0


def _row(name: str, row: dict) -> str:
    total = sum(row[p] for p in PHASES)
    return (f"| {name} | {int(row['cases'])} | " + " | ".join(f"{row[p]:.1f}" for p in PHASES)
            + f" | {total:.1f} | {int(row['samples'])} |")


if __name__ == "__main__":
    sys.exit(main())

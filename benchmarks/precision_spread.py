"""Within-run precision against run-to-run spread, from the records of runs of one sweep.

    python3 benchmarks/precision_spread.py results.db RUN_ID [RUN_ID ...]

For each run: its wall time and the distribution of each case's CI half-width (95% bootstrap CI of the
median, from the stored samples), over all backends and by sequence length. With two or more runs: for
each case that is ``ok`` in every run, the spread of its median across the runs ((max - min) / mean, %),
beside its within-run CI half-width, per backend and by sequence length, by what the records say went
on while they were timed (``cause``), and the noisiest cases. Prints markdown.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np

from attnbench.results.store import ResultStore
from attnbench.timing.stats import median_ci_half_width_pct


def pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def size_class(seq_len: int) -> str:
    return "S <= 512" if seq_len <= 512 else "S 1k-4k" if seq_len <= 4096 else "S >= 8k"


CLOCK_MOVED = 0.02
"""A case whose SM clock across its timed calls (``gpu_state.window``, median) differs by more than this between
runs is put down to the clock."""


def window_clock(r) -> float | None:
    """The median SM clock (MHz) across a record's timed calls, where it was sampled."""
    window = ((r.info or {}).get("gpu_state") or {}).get("window") or {}
    return (window.get("sm_clock_mhz") or {}).get("median")


def cause(records) -> str:
    """What the records of one case in several runs point at for its spread: ``host-bound`` (a call the host
    issues slower than the device runs it, in any run), ``clock moved`` (the window's median clock differs by
    more than CLOCK_MOVED between runs, or fell within a run: ``clock_dropped``), ``steady clock`` (sampled,
    neither), ``no window`` (no clock sampled: older records, or no NVML)."""
    if any(((r.info or {}).get("launch") or {}).get("host_bound") for r in records):
        return "host-bound"
    clocks = [window_clock(r) for r in records]
    if any((r.info or {}).get("clock_dropped") for r in records):
        return "clock moved"
    if any(c is None for c in clocks):
        return "no window"
    return "clock moved" if (max(clocks) - min(clocks)) > CLOCK_MOVED * max(clocks) else "steady clock"


def print_causes(rows, records_of) -> None:
    """The spread of the cases grouped by ``cause``."""
    by: dict[str, list] = defaultdict(list)
    for key, spread, _ in rows:
        by[cause(records_of[key])].append(spread)
    print("\nSpread by what the records say went on while the case was timed (`cause`):\n")
    print("| cause | cases | spread median | spread p90 |")
    print("|---|---:|---:|---:|")
    for name in ("host-bound", "clock moved", "steady clock", "no window"):
        if by[name]:
            print(f"| {name} | {len(by[name])} | {pct(by[name], 50):.2f}% | {pct(by[name], 90):.2f}% |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("run_ids", nargs="+")
    args = ap.parse_args(argv)
    runs: dict[str, dict] = {}
    with ResultStore(args.db, readonly=True) as store:
        for run_id in args.run_ids:
            meta = store.run(run_id)
            if meta is None:
                print(f"no run {run_id} in {args.db}", file=sys.stderr)
                return 2
            runs[run_id] = {"meta": meta, "records": [r for r in store.records(run_id) if r.status == "ok"
                                                      and len(r.samples_ms) >= 10]}
    ci: dict[str, dict[tuple, float]] = {}
    print("| run | wall s | ok cases | samples | CI half-width median | p90 | max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run_id, run in runs.items():
        meta = run["meta"]
        ci[run_id] = {(r.backend, r.case_id): median_ci_half_width_pct(r.samples_ms) for r in run["records"]}
        values = list(ci[run_id].values())
        wall = (meta["finished_at"] or 0) - (meta["created_at"] or 0)
        samples = sum(len(r.samples_ms) for r in run["records"])
        print(f"| {run_id} | {wall:.0f} | {len(values)} | {samples} | {pct(values, 50):.2f}% | {pct(values, 90):.2f}% "
              f"| {max(values):.2f}% |")
    first = next(iter(runs.values()))["records"]
    by_size: dict[str, list] = defaultdict(list)
    for r in first:
        by_size[size_class(max(r.spec.seqlens_q))].append(ci[args.run_ids[0]][(r.backend, r.case_id)])
    print(f"\nCI half-width by sequence length ({args.run_ids[0]}):\n")
    print("| lengths | cases | median | p90 |")
    print("|---|---:|---:|---:|")
    for name in ("S <= 512", "S 1k-4k", "S >= 8k"):
        print(f"| {name} | {len(by_size[name])} | {pct(by_size[name], 50):.2f}% | {pct(by_size[name], 90):.2f}% |")
    if len(runs) < 2:
        return 0
    medians: dict[tuple, list] = defaultdict(list)
    records_of: dict[tuple, list] = defaultdict(list)
    specs = {}
    for run in runs.values():
        for r in run["records"]:
            medians[(r.backend, r.case_id)].append(r.median_ms)
            records_of[(r.backend, r.case_id)].append(r)
            specs[(r.backend, r.case_id)] = r
    rows = []
    for key, values in medians.items():
        if len(values) == len(runs):
            spread = 100 * (max(values) - min(values)) / float(np.mean(values))
            within = float(np.median([ci[run_id][key] for run_id in runs]))
            rows.append((key, spread, within))
    print(f"\nRun-to-run spread of each case's median over {len(runs)} runs ((max - min) / mean), beside the "
          f"within-run CI half-width (median over the runs), {len(rows)} cases ok in every run:\n")
    print("| group | cases | spread median | spread p90 | CI half-width median | CI p90 |")
    print("|---|---:|---:|---:|---:|---:|")
    groups: dict[str, list] = defaultdict(list)
    for row in rows:
        groups["all"].append(row)
        groups[size_class(max(specs[row[0]].spec.seqlens_q))].append(row)
    for name in ("all", "S <= 512", "S 1k-4k", "S >= 8k"):
        g = groups[name]
        print(f"| {name} | {len(g)} | {pct([x[1] for x in g], 50):.2f}% | {pct([x[1] for x in g], 90):.2f}% | "
              f"{pct([x[2] for x in g], 50):.2f}% | {pct([x[2] for x in g], 90):.2f}% |")
    print_causes(rows, records_of)
    per_backend: dict[str, list] = defaultdict(list)
    for row in rows:
        per_backend[row[0][0]].append(row)
    print("\nPer backend (sorted by the median spread):\n")
    print("| backend | cases | spread median | spread p90 | CI half-width median |")
    print("|---|---:|---:|---:|---:|")
    for name, g in sorted(per_backend.items(), key=lambda kv: -pct([x[1] for x in kv[1]], 50)):
        print(f"| {name} | {len(g)} | {pct([x[1] for x in g], 50):.2f}% | {pct([x[1] for x in g], 90):.2f}% | "
              f"{pct([x[2] for x in g], 50):.2f}% |")
    print("\nNoisiest cases across runs:\n")
    for key, spread, within in sorted(rows, key=lambda x: -x[1])[:12]:
        r = specs[key]
        values = ", ".join(f"{v:.4g}" for v in medians[key])
        clocks = ", ".join(f"{c:.0f}" if (c := window_clock(x)) is not None else "-" for x in records_of[key])
        print(f"- {r.backend} {r.spec.label()} {r.spec.pass_}: spread {spread:.1f}% (medians {values} ms; "
              f"SM MHz {clocks}), within-run CI {within:.2f}%, {cause(records_of[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FlashMLA's own times beside attnbench's at the same shapes (``benchmarks/sparse_authors.sh``): one row per case,
their kineto kernel time and each of attnbench's timings (events back to back, events with idle gaps, the profiler's
kernel time), the ratio of each to theirs, and the median SM clock each ran at.

    python3 benchmarks/sparse_authors_table.py THEIR.jsonl STORE.db
"""

from __future__ import annotations

import json
import sys

from attnbench.results.store import ResultStore

RUNS = {"prefill": ("prefill-events", "prefill-idle", "prefill-profiler"),
        "fp8 decode": ("decode-events", "decode-idle", "decode-profiler")}


def _clock(window: dict | None) -> str:
    clock = (window or {}).get("sm_clock_mhz") or {}
    return f"{clock['median']:.0f}" if clock.get("median") else "-"


def main(their_path: str, db: str) -> int:
    theirs = [json.loads(line) for line in open(their_path) if line.strip()]
    store = ResultStore(db)
    ours: dict[tuple, dict] = {}
    for runs in RUNS.values():
        for run in runs:
            for r in store.records(run):
                key = (run, r.spec.s_kv if not r.spec.decode else r.spec.batch)
                ours[key] = {"ms": r.median_ms, "tflops": r.tflops, "status": r.status,
                             "verdict": (r.accuracy or {}).get("verdict"),
                             "clock": _clock(((r.info or {}).get("gpu_state") or {}).get("window"))}
    head = (f"{'case':<28} {'theirs ms':>9} {'MHz':>5} | {'events':>7} {'/theirs':>7} {'MHz':>5} | {'idle 1':>7} "
            f"{'/theirs':>7} {'MHz':>5} | {'profiler':>8} {'/theirs':>7} | check")
    print(head)
    print("-" * len(head))
    for row in theirs:
        if row["case"] == "prefill" and not row["sink"]:
            continue
        if row["case"] == "fp8 decode" and row["varlen"]:
            label, key = f"fp8 decode b{row['batch']} varlen (theirs)", None
        elif row["case"] == "fp8 decode":
            label, key = f"fp8 decode b{row['batch']}", row["batch"]
        else:
            label, key = f"prefill s_kv {row['s_kv']} sink", row["s_kv"]
        their_ms = row["us"] / 1e3
        cells = []
        for run in RUNS[row["case"]]:
            got = ours.get((run, key)) if key is not None else None
            if got is None or got["ms"] is None:
                cells.append((None, None, "-"))
            else:
                cells.append((got["ms"], got["ms"] / their_ms, got["clock"]))
        (ev, evr, evc), (idle, idler, idlec), (prof, profr, _) = cells
        fmt = lambda v, spec: "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)  # noqa: E731
        check = (ours.get((RUNS[row["case"]][0], key)) or {}).get("verdict") or "-"
        print(f"{label:<28} {their_ms:>9.3f} {_clock(row.get('window')):>5} | {fmt(ev, '7.3f')} {fmt(evr, '7.3f')} "
              f"{evc:>5} | {fmt(idle, '7.3f')} {fmt(idler, '7.3f')} {idlec:>5} | {fmt(prof, '8.3f')} "
              f"{fmt(profr, '7.3f')} | {check}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))

"""Do the compile-ahead workers slow the cases the main process times, and does pausing them help?

Starts the compile-ahead workers on every compile-ahead case of the default sweep (as `attnbench run`
does) and, while they work, times a few target cases over and over in the main process, alternating
between the workers stopped during the timing (what `attnbench run` does) and left running. Prints,
per target and mode, the median of the case medians and the share of rounds more than 20% above the
best; raw rounds go to a CSV.

    python3 benchmarks/worker_contention.py [--rounds 40] [--csv rounds.csv]

Run it with cold compile caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, FLASHINFER_WORKSPACE_BASE
pointing at empty folders), or the workers have little to do.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import time

from attnbench.cli.run import plan_from_options
from attnbench.inputs import make_inputs
from attnbench.precompile import Precompiler
from attnbench.runner import Runner
from attnbench.spec import AttnSpec

TARGETS = [("fa3", 2048, False, "fwd_bwd"), ("fa2-qkvpacked", 2048, False, "fwd_bwd"), ("naive", 256, True, "fwd"),
           ("sdpa-cudnn", 2048, True, "fwd")]
"""Cases seen ~2x slow in one default sweep of three on an H100 (backend, S, causal, pass)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="at most this many rounds per mode")
    ap.add_argument("--csv", default=None, help="write every round here")
    args = ap.parse_args()

    plan = plan_from_options({})
    runner = Runner(plan.options, run_id="contention", env_id=None, sink=lambda r: None)
    ahead = [(s, b) for s, b in runner.cases(plan.specs) if b.compiles_ahead and b.supports(s, runner.device) is None]
    names = {b.name for b in runner.backends}
    targets = [(next(b for b in runner.backends if b.name == name),
                AttnSpec(batch=2, seqlens_q=(n,), heads_q=16, head_dim=128, dtype="bf16", causal=causal, pass_=p))
               for name, n, causal, p in TARGETS if name in names]
    prepared = [(b, s, make_inputs(s, runner.device, 0)) for b, s in targets]
    for backend, spec, inputs in prepared:  # first calls (cuDNN plans, lazy loads) before the workers start
        runner.run_case(spec, backend, inputs)

    start = time.monotonic()
    workers = Precompiler(ahead, device=str(runner.device), seed=0, inputs_dist=plan.options.inputs)
    runner.precompiler = workers
    print(f"{len(ahead)} compile-ahead cases in {workers.workers} workers; targets: "
          + ", ".join(f"{b.name} {s.label()} {s.pass_}" for b, s, _ in prepared), flush=True)
    rows = []
    pause = workers.paused
    for round_ in range(args.rounds):
        if not workers.busy and round_ > 0:
            break
        for mode in ("paused", "running"):
            workers.paused = pause if mode == "paused" else (lambda: contextlib.nullcontext(0))
            for backend, spec, inputs in prepared:
                busy = workers.busy
                record = runner.run_case(spec, backend, inputs)
                rows.append({"round": round_, "t_s": round(time.monotonic() - start, 2), "mode": mode,
                             "workers_busy": busy, "backend": backend.name, "case": f"{spec.label()} {spec.pass_}",
                             "median_ms": record.median_ms, "n": record.n})
    workers.paused = pause
    workers.close()
    print(f"{len(rows) // (2 * max(1, len(prepared)))} rounds in {time.monotonic() - start:.0f} s "
          f"({sum(r['workers_busy'] for r in rows)} of {len(rows)} timings with workers busy)\n")
    print("| case | workers | rounds | median of medians (ms) | best (ms) | rounds > 1.2x best | worst / best |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for backend, spec, _ in prepared:
        mine = [r for r in rows if r["backend"] == backend.name and r["workers_busy"] and r["median_ms"]]
        best = min((r["median_ms"] for r in mine), default=None)
        for mode in ("paused", "running"):
            ms = [r["median_ms"] for r in mine if r["mode"] == mode]
            if not ms:
                continue
            slow = sum(m > 1.2 * best for m in ms)
            print(f"| {backend.name} {spec.label()} {spec.pass_} | {mode} | {len(ms)} | {statistics.median(ms):.4f} "
                  f"| {best:.4f} | {slow} | {max(ms) / best:.2f} |")
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

"""Captured events against eager events: the same cases timed both ways, read from one results file.

    attnbench run --db cap.db --run-id captured --seq-lens 128,256,512,1024,2048
    attnbench run --db cap.db --run-id eager --no-capture --seq-lens 128,256,512,1024,2048
    python3 benchmarks/capture_check.py cap.db captured eager [--caps 150,200,250,350]

Prints, per sequence length and pass: how many cases were captured (and why the others were not),
the ratio of the medians captured / eager (median, p10, p90 over cases), the median CI half-width
of each run and the seconds spent timing. Then, for the captured run, a replay of its stored samples
under other sampling caps: the timing seconds and CI half-widths each cap would have given.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict

import numpy as np

from attnbench.results.store import ResultStore
from attnbench.timing.config import MIN_SAMPLES
from attnbench.timing.stats import median_ci_half_width_pct


def _key(r) -> tuple:
    return (r.backend, r.spec.label(), r.spec.causal, r.spec.pass_)


def _hw(r) -> float | None:
    ci = r.info.get("median_ci95_ms")
    return 100 * (ci[1] - ci[0]) / 2 / r.median_ms if ci and r.median_ms else None


def _q(values, q) -> str:
    values = [v for v in values if v is not None]
    return f"{np.percentile(values, q):.3f}" if values else "-"


def replay(samples: list[float], timing_s: float, cap_ms: float, ci_target: float = 0.1) -> tuple[int, float]:
    """Samples a cap would have kept (the sampling loop looks again after doubling) and their wall s,
    assuming the case's wall time was spread evenly over its samples."""
    n_all = len(samples)
    per = timing_s * 1e3 / max(n_all, 1)
    n = min(n_all, MIN_SAMPLES)
    while n < n_all and n * per < cap_ms and median_ci_half_width_pct(samples[:n]) > ci_target:
        n = min(n_all, 2 * n, max(n + 1, math.ceil(cap_ms / per)))
    return n, n * per / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("captured")
    ap.add_argument("eager")
    ap.add_argument("--caps", default="150,200,250,350", help="caps (ms) to replay the captured run's samples under")
    args = ap.parse_args(argv)
    with ResultStore(args.db, create=False) as store:
        cap = {_key(r): r for r in store.records(args.captured) if r.status == "ok"}
        eager = {_key(r): r for r in store.records(args.eager) if r.status == "ok"}
    both = sorted(set(cap) & set(eager), key=lambda k: (cap[k].spec.seqlens_q[0], k))
    if not both:
        print("no case is ok in both runs", file=sys.stderr)
        return 2
    groups: dict[tuple, list] = defaultdict(list)
    for k in both:
        groups[(cap[k].spec.seqlens_q[0], k[3])].append(k)
    print(f"{len(both)} cases ok in both runs\n")
    print("| S | pass | cases | captured | ratio median | p10 | p90 | CI hw % captured | eager | timing s captured | eager |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (s, pass_), keys in sorted(groups.items()):
        ratios = [cap[k].median_ms / eager[k].median_ms for k in keys]
        n_cap = sum("events_captured" in cap[k].info for k in keys)
        t_cap = sum(cap[k].info.get("wall_s", {}).get("timing", 0.0) for k in keys)
        t_eag = sum(eager[k].info.get("wall_s", {}).get("timing", 0.0) for k in keys)
        print(f"| {s} | {pass_} | {len(keys)} | {n_cap} | {np.median(ratios):.4f} | {_q(ratios, 10)} | {_q(ratios, 90)} "
              f"| {_q([_hw(cap[k]) for k in keys], 50)} | {_q([_hw(eager[k]) for k in keys], 50)} "
              f"| {t_cap:.1f} | {t_eag:.1f} |")
    captured = [k for k in both if "events_captured" in cap[k].info]
    ratios = [cap[k].median_ms / eager[k].median_ms for k in captured]
    if ratios:
        print(f"\ncaptured cases: {len(captured)}, median ratio {np.median(ratios):.4f} "
              f"(p10 {_q(ratios, 10)}, p90 {_q(ratios, 90)}, min {min(ratios):.4f}, max {max(ratios):.4f})")
        worst = sorted(captured, key=lambda k: -abs(np.log(cap[k].median_ms / eager[k].median_ms)))[:8]
        for k in worst:
            print(f"- {' '.join(map(str, k))}: {cap[k].median_ms * 1e3:.2f} us captured, "
                  f"{eager[k].median_ms * 1e3:.2f} us eager")
    reasons = Counter((k[0], cap[k].info["events_capture_fallback"][:120]) for k in both
                      if "events_capture_fallback" in cap[k].info)
    if reasons:
        print("\nnot captured:")
        for (backend, why), n in sorted(reasons.items()):
            print(f"- {backend} ({n} cases): {why}")
    print("\nreplay of the captured run's samples under other caps (all its cases):\n")
    print("| cap ms | timing s | CI hw % median | p90 |")
    print("|---:|---:|---:|---:|")
    for cap_ms in (float(c) for c in args.caps.split(",")):
        total, widths = 0.0, []
        for k in cap:
            r = cap[k]
            if len(r.samples_ms) < MIN_SAMPLES:
                continue
            n, seconds = replay(r.samples_ms, r.info.get("wall_s", {}).get("timing", 0.0), cap_ms)
            total += seconds
            widths.append(median_ci_half_width_pct(r.samples_ms[:n]))
        print(f"| {cap_ms:.0f} | {total:.1f} | {np.median(widths):.3f} | {np.percentile(widths, 90):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""P1 fidelity: do attnbench's timing modes agree with Nsight Compute's kernel durations?

For fwd bf16 shapes whose kernels take ~10 us to ~20 ms and three SDPA backends, time each case with
``events`` (per call, cold L2), ``graph`` (CUDA-graph replays over rotating input copies) and
``profiler`` (torch.profiler kernel sum), then once more under ncu (``gpu__time_duration.sum``,
``--clock-control none``, one child process for all cases) and print the % difference of each
mode's median from ncu's. Targets: events within 3% for kernels >= 50 us; graph within 5% for
10-50 us. Writes fidelity.csv and fidelity.md into --out.

    PYTHONPATH=src python3 benchmarks/fidelity.py --out docs/results/fidelity-h100
"""

from __future__ import annotations

import argparse
import csv
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig
from attnbench.timing.external import ExternalCase, find_tool, run_external

BACKENDS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
# (batch, seq, heads, head_dim): from ~10 us to ~20 ms of forward kernel time on an H100.
SHAPES = ((1, 256, 8, 64), (1, 512, 16, 128), (2, 1024, 16, 128), (2, 2048, 16, 128), (2, 4096, 16, 128),
          (1, 8192, 16, 128), (2, 16384, 16, 128))
MODES = ("events", "graph", "profiler")
NCU_CALLS = 5


def specs(shapes) -> list[AttnSpec]:
    return [AttnSpec(batch=b, seqlens_q=(s,), heads_q=h, head_dim=d, dtype="bf16", pass_="fwd") for b, s, h, d in shapes]


def time_modes(cases: list[AttnSpec], repeat: int) -> dict:
    """{(backend, label, mode): record} for every in-process mode."""
    out = {}
    for mode in MODES:
        cfg = TimingConfig(warmup=5, repeat=repeat, mode=mode)
        runner = Runner(RunOptions(device="cuda", backends=BACKENDS, timing=cfg), run_id=f"fidelity-{mode}",
                        env_id=None, sink=lambda r: None)
        for rec in runner.run(cases):
            out[(rec.backend, rec.spec.label(), mode)] = rec
    return out


def time_ncu(cases: list[AttnSpec], ok: set) -> dict:
    """{(backend, label): (median ms, kernels)} measured under ncu in one child process."""
    todo = [ExternalCase(spec=s, backend=b, iterations=NCU_CALLS) for s in cases for b in BACKENDS
            if (b, s.label()) in ok]
    results = run_external("ncu", todo, device="cuda", warmup=3, timeout_s=1200)
    return {(c.backend, c.spec.label()): (statistics.median(samples), info["kernels"])
            for c, (samples, info) in zip(todo, results, strict=True)}


def pct(value, ref):
    return None if value is None or not ref else 100.0 * (value - ref) / ref


def verdict(ncu_ms, d_events, d_graph) -> str:
    if ncu_ms is None:
        return "no ncu"
    if ncu_ms >= 0.05:
        return "ok" if d_events is not None and abs(d_events) <= 3 else "MISS events"
    if ncu_ms >= 0.01:
        return "ok" if d_graph is not None and abs(d_graph) <= 5 else "MISS graph"
    return "below 10 us"


def build_rows(cases, records, ncu) -> list[dict]:
    rows = []
    for spec in cases:
        for backend in BACKENDS:
            recs = {m: records.get((backend, spec.label(), m)) for m in MODES}
            if any(r is None or r.status != "ok" for r in recs.values()):
                bad = next(r for r in recs.values() if r is not None and r.status != "ok")
                rows.append({"backend": backend, "case": spec.label(), "status": f"{bad.status}: {bad.reason}"})
                continue
            ncu_ms, kernels = ncu.get((backend, spec.label()), (None, []))
            row = {"backend": backend, "case": spec.label(), "status": "ok", "ncu_ms": ncu_ms}
            for m in MODES:
                row[f"{m}_ms"] = recs[m].median_ms
                row[f"{m}_vs_ncu_pct"] = pct(recs[m].median_ms, ncu_ms)
            row["graph_cold"] = recs["graph"].info.get("graph_cold", recs["graph"].info.get("graph_fallback"))
            row["kernels"] = "; ".join(k[:60] for k in (kernels or recs["profiler"].info.get("kernels", [])))
            row["verdict"] = verdict(ncu_ms, row["events_vs_ncu_pct"], row["graph_vs_ncu_pct"])
            rows.append(row)
    return rows


COLUMNS = ("backend", "case", "ncu_ms", "events_ms", "events_vs_ncu_pct", "graph_ms", "graph_vs_ncu_pct",
           "profiler_ms", "profiler_vs_ncu_pct", "graph_cold", "verdict", "status", "kernels")


def fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write(rows, out: Path, header: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "fidelity.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    cols = COLUMNS[:-1]
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    (out / "fidelity.md").write_text("\n".join(lines) + "\n")


def show(rows, console: Console) -> None:
    table = Table(title="timing modes vs ncu gpu__time_duration (median, % difference)", header_style="bold")
    for col in ("backend", "case", "ncu ms", "events", "graph", "profiler", "verdict"):
        table.add_column(col, justify="left" if col in ("backend", "case", "verdict") else "right")
    for r in rows:
        if r["status"] != "ok":
            table.add_row(r["backend"], r["case"], "-", "-", "-", "-", r["status"][:40])
            continue
        cells = [f"{r[f'{m}_ms']:.4f} ({'-' if r[f'{m}_vs_ncu_pct'] is None else format(r[f'{m}_vs_ncu_pct'], '+.1f')}%)"
                 for m in MODES]
        table.add_row(r["backend"], r["case"], "-" if r["ncu_ms"] is None else f"{r['ncu_ms']:.4f}", *cells, r["verdict"])
    console.print(table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Directory for fidelity.csv and fidelity.md.")
    parser.add_argument("--repeat", type=int, default=30, help="Minimum samples per mode (and >= 200 ms).")
    parser.add_argument("--quick", action="store_true", help="Only the first four shapes.")
    parser.add_argument("--no-ncu", action="store_true", help="Skip ncu (columns stay empty).")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fidelity.py needs a CUDA device", file=sys.stderr)
        return 2
    console, t0 = Console(width=200), time.time()
    cases = specs(SHAPES[:4] if args.quick else SHAPES)
    records = time_modes(cases, args.repeat)
    ok = {(backend, label) for (backend, label, _), r in records.items() if r.status == "ok"}
    ncu = {}
    if not args.no_ncu and find_tool("ncu"):
        ncu = time_ncu(cases, ok)
    rows = build_rows(cases, records, ncu)
    show(rows, console)
    header = (f"# attnbench timing fidelity\n\ndevice: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; wall {time.time() - t0:.0f} s\n\n"
              f"command: `PYTHONPATH=src python3 {shlex.join(['benchmarks/fidelity.py', *(argv or sys.argv[1:])])}`")
    write(rows, args.out, header)
    console.print(f"wrote {args.out / 'fidelity.csv'} and {args.out / 'fidelity.md'} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

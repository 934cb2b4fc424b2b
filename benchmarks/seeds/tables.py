"""The write-ups' own output formats, from runs in an attnbench store.

    python3 benchmarks/seeds/tables.py benchmark-attn --db DB --run RUN [RUN ...]  # benchmark_attn.py's series
    python3 benchmarks/seeds/tables.py fa2-writeup --db DB --run RUN [RUN ...]     # the FA2 write-up's table
    python3 benchmarks/seeds/tables.py naive-vs-fa2 --db DB --run RUN [RUN ...] -o FILE.json  # naive vs FA2 rows

benchmark-attn: benchmark_attn.py's series (CUDA events, ncu, nsys), a table per kernel and sequence kind, and a
summary of each profiler's times over the events times.

fa2-writeup: one Markdown table per backend (and causal setting) with the FA2 write-up's columns, named as
`attnbench dist` names them (batch | seq_len | heads | head_size | fwd_only | iters/s | ms/iter | MB/device |
TFLOP/s), rows in the write-up's order (fwd_only True first, then False; batch, then seq_len).
On one GPU "per device" is that GPU; `attnbench dist` prints the same table for N ranks.

naive-vs-fa2: the rows of naive PyTorch against flash-attn 2 as JSON, one object per (impl, causal, axis value):
impl is "Pytorch" (naive) or "Flash2" (fa2) and other backends under their own names; times in seconds, FLOPS
in TFLOP/s, peak memory in MB, as that write-up's table prints them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from attnbench.cli.dist import TABLE_COLUMNS
from attnbench.results.record import Record
from attnbench.results.store import ResultStore

FORMATS = ("benchmark-attn", "fa2-writeup", "naive-vs-fa2")
OLD_NAMES = {"seed000": "benchmark-attn", "seed001": "fa2-writeup", "seed003": "naive-vs-fa2"}
"""The formats' first names, still accepted (older commands and notes use them) but no longer shown."""
RUN_PREFIXES = ("benchmark-attn-", "seed000-")
"""benchmark_attn.sh's run ids start with the first; runs stored before its rename, with the second."""
NAIVE_VS_FA2_NAMES = {"naive": "Pytorch", "fa2": "Flash2"}
NAIVE_VS_FA2_PASSES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward_backward"}


def _records(db: Path, runs: list[str]) -> list[Record]:
    with ResultStore(db, create=False) as store:
        return [r for run in runs for r in store.records(run)]


def fa2_writeup_tables(records: list[Record]) -> str:
    """The FA2 write-up's table per backend (dense, non-causal fwd / fwd_bwd cases)."""
    by_backend: dict[str, list[tuple[int, Record]]] = defaultdict(list)
    runs = list(dict.fromkeys(r.run_id for r in records))
    for r in records:
        if r.spec.pass_ in ("fwd", "fwd_bwd") and not r.spec.is_varlen:
            name = f"{r.backend} (causal)" if r.spec.causal else r.backend
            by_backend[name].append((runs.index(r.run_id), r))
    columns = (*TABLE_COLUMNS, "TFLOP/s")  # `attnbench dist`'s columns, then the rate (the last cell of a row)
    out = []
    for backend, indexed in by_backend.items():  # forward first; then in the order of the runs given
        indexed.sort(key=lambda ir: (ir[1].spec.pass_ != "fwd", ir[0], ir[1].spec.batch, ir[1].spec.seqlens_q[0]))
        rows = [r for _, r in indexed]
        out += [f"### {backend} on 1 GPU", "| " + " | ".join(columns) + " |",
                "| " + " | ".join(":----:" for _ in columns) + " |"]
        for r in rows:
            s = r.spec
            if r.status != "ok" or not r.median_ms:
                cells = ["-", "-", "-", f"{r.status}: {r.reason or ''}".strip(": ")]
            else:
                mem = "n/a" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**20:.0f}"
                cells = [f"{1e3 / r.median_ms:.3f}", f"{r.median_ms:.3f}", mem, f"{r.tflops:.1f}"]
            out.append("| " + " | ".join([str(s.batch), str(s.seqlens_q[0]), str(s.heads_q), str(s.head_dim),
                                          str(s.pass_ == "fwd"), *cells]) + " |")
        out.append("")
    return "\n".join(out)


def _series(run_id: str) -> tuple[str, str]:
    """benchmark_attn.sh's run id -> (series, sequences): benchmark-attn-single -> (events, single),
    benchmark-attn-ncu-grouped -> (ncu, grouped)."""
    name = next((run_id.removeprefix(p) for p in RUN_PREFIXES if run_id.startswith(p)), run_id)
    kind = "grouped" if name.endswith("grouped") else "single"
    name = name.removesuffix("-grouped").removesuffix("grouped")
    return (name if name not in ("", "single") else "events"), kind


def _ratio_cell(ratios: list[float]) -> str:
    """The median of a profiler's times over the events times, and their range."""
    if not ratios:
        return "—"
    return f"{statistics.median(ratios):.2f}" + (f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else "")


def benchmark_attn_tables(records: list[Record]) -> str:
    """benchmark_attn.py's series (CUDA events, ncu, nsys) side by side. First a summary: per kernel and sequence
    kind, each profiler's median over the events median (the median of those ratios over the lengths both timed, and
    their range). Then per kernel and sequence kind, a row per sequence length (single) or number of 128-token
    sequences (grouped), each series' median in ms; rows where no series ran the case (a kernel without
    variable-length input, asked for groups) are left out and counted under the table."""
    series = list(dict.fromkeys(_series(r.run_id)[0] for r in records))
    profilers = [name for name in series if name != "events"]
    cells: dict[tuple[str, str], dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    times: dict[tuple[str, str], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        name, kind = _series(r.run_id)
        x = len(r.spec.seqlens_q) if kind == "grouped" else r.spec.seqlens_q[0]
        ok = r.status == "ok" and r.median_ms is not None
        cells[(r.backend, kind)][x][name] = f"{r.median_ms:.4g}" if ok else r.status
        if ok:
            times[(r.backend, kind)][x][name] = r.median_ms
    order = sorted(cells, key=lambda key: (key[1] != "single", key[0]))  # single sequences first
    out = []
    if profilers and "events" in series:
        out += ["### Each profiler against the events series (time ÷ events time: median over the lengths, range)", "",
                "| kernel | sequences | " + " | ".join(profilers) + " |", "|---|---|" + "---:|" * len(profilers)]
        for key in order:
            ratios = {p: [row[p] / row["events"] for row in times[key].values() if p in row and "events" in row]
                      for p in profilers}
            if any(ratios.values()):
                out.append(f"| {key[0]} | {key[1]} | " + " | ".join(_ratio_cell(ratios[p]) for p in profilers) + " |")
        out.append("")
    for key in order:
        backend, kind = key
        axis = "sequences of 128" if kind == "grouped" else "seq_len"
        shown = {x: row for x, row in cells[key].items() if any(cell != "unsupported" for cell in row.values())}
        out += [f"### {backend}, {'grouped sequences' if kind == 'grouped' else 'single sequence'} (ms)", "",
                f"| {axis} | " + " | ".join(series) + " |", "|---:|" + "---:|" * len(series)]
        out += [f"| {x} | " + " | ".join(row.get(name, "—") for name in series) + " |" for x, row in sorted(shown.items())]
        if left := sorted(set(cells[key]) - set(shown)):
            out.append(f"\nUnsupported by every series: {', '.join(map(str, left))} {axis.split()[0]}.")
        out.append("")
    return "\n".join(out)


def naive_vs_fa2_rows(records: list[Record]) -> list[dict]:
    """The rows of naive PyTorch against flash-attn 2: per backend, causal setting and shape, the three passes side
    by side."""
    rows: dict[tuple, dict] = {}
    for r in records:
        s = r.spec
        key = (r.backend, s.causal, s.batch, s.seqlens_q[0], s.heads_q, s.head_dim)
        row = rows.setdefault(key, {"impl": NAIVE_VS_FA2_NAMES.get(r.backend, r.backend), "causal": s.causal,
                                    "batch_size": s.batch, "seq_len": s.seqlens_q[0], "num_heads": s.heads_q,
                                    "emb_dim": s.heads_q * s.head_dim, "head_size": s.head_dim})
        name = NAIVE_VS_FA2_PASSES[s.pass_]
        ok = r.status == "ok" and r.median_ms is not None
        row[f"{name}_time"] = r.median_ms / 1e3 if ok else None
        row[f"{name}_FLOPS"] = r.tflops if ok else None
        if r.peak_mem_bytes is not None and ok:
            row["peak_memory_usage"] = max(row.get("peak_memory_usage") or 0.0, r.peak_mem_bytes / 2**20)
        if not ok:
            first_sentence = (r.reason or "").split(". ")[0]
            row.setdefault("skipped", {})[name] = f"{r.status}: {first_sentence}".strip(": ")
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # an old name is read as its new one before the choices are checked, so help and errors show the new ones only
    parser.add_argument("format", type=lambda name: OLD_NAMES.get(name, name), choices=FORMATS)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--run", nargs="+", required=True)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
    args = parser.parse_args(argv)
    if not args.db.exists():
        print(f"tables.py: no such database: {args.db}", file=sys.stderr)
        return 2
    records = _records(args.db, args.run)
    if not records:
        print(f"tables.py: no records for run(s) {', '.join(args.run)} in {args.db}", file=sys.stderr)
        return 2
    if args.format == "benchmark-attn":
        text = benchmark_attn_tables(records)
    elif args.format == "fa2-writeup":
        text = fa2_writeup_tables(records)
    else:
        text = json.dumps(naive_vs_fa2_rows(records), indent=1)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MLA decode through attnbench at FlashMLA's own benchmark shapes, beside that benchmark's numbers.

    python3 benchmarks/mla.py run  --db mla.db [--run-id mla] [--backends flashmla,fa3-mla] [--heads 128]
    python3 benchmarks/mla.py page --db mla.db --script-log flashmla-bench.log [-o page.md]

The shapes are ``benchmark/bench_flash_mla.py``'s in deepseek-ai/FlashMLA: b = 128 requests, s_q = 1, h_q = 128
(``--heads``), one KV head, d = 576, dv = 512, causal, bf16, pages of 64, cache lengths ``L + 2·i`` for request i
with L = 1k, 2k, 4k, 8k, 16k, 32k, and its default softmax scale 1/√576. Its bytes and FLOPs are counted as
attnbench counts MLA (the same formulas: ``attnbench.metrics``). ``--script-log`` is the output of that script
run as its authors do (``python3 benchmark/bench_flash_mla.py --one --target flash_mla``); the page sets its
times beside attnbench's.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCH = 128


def specs(heads: int) -> list:
    from attnbench.spec import AttnSpec
    return [AttnSpec(seqlens_q=(1,) * BATCH, seqlens_k=tuple(n + 2 * i for i in range(BATCH)), heads_q=heads,
                     heads_kv=1, head_dim=576, head_dim_v=512, dtype="bf16", causal=True, mla=True, page_size=64)
            for n in LENGTHS]


def cmd_run(args) -> None:
    from attnbench.cli.run import execute, plan_from_options
    plan = plan_from_options({"backends": args.backends.split(","), "db": args.db, "device": "cuda",
                              "skip_missing": True, "check": not args.no_check})
    plan = dataclasses.replace(plan, specs=[s for h in args.heads.split(",") for s in specs(int(h))])
    run_id, records, phases = execute(plan, run_id=args.run_id, checker=None)
    for r in records:
        print(f"{r.backend:>10} {r.spec.label()[:60]:<60} {r.status:>6} "
              f"{(r.median_ms or 0) * 1e3:8.1f} µs {r.gbps or 0:6.0f} GB/s {r.tflops or 0:5.0f} TF/s", flush=True)


def cell(r) -> str:
    return f"{r.median_ms * 1e3:.0f} µs · {r.gbps:.0f} GB/s · {r.tflops:.0f} TF/s" if r else "—"


SCRIPT_LINE = re.compile(r"perf flash_mla: ([\d.]+) ms, (\d+) TFLOPS, (\d+) GB/s")


def cmd_page(args) -> None:
    from attnbench.results.store import ResultStore
    store = ResultStore(args.db, create=False, readonly=True)
    records = [r for r in store.records(args.run_id)]
    script = [tuple(map(float, m.groups())) for m in SCRIPT_LINE.finditer(Path(args.script_log).read_text())] \
        if args.script_log else []
    lines = ["| mean cache | FlashMLA's script | attnbench `flashmla` | ratio | attnbench `fa3-mla` |",
             "|---:|---:|---:|---:|---:|"]
    for i, n in enumerate(LENGTHS):
        mean = n + BATCH - 1
        by = {r.backend: r for r in records if r.spec.seqlens_k[0] == n and r.spec.heads_q == 128 and r.status == "ok"}
        s = script[i] if i < len(script) else None
        f, a = by.get("flashmla"), by.get("fa3-mla")
        ratio = f"{f.median_ms / s[0]:.3f}" if f and s else "—"
        lines.append(f"| {mean} | " + (f"{s[0] * 1e3:.0f} µs · {s[2]:.0f} GB/s · {s[1]:.0f} TF/s" if s else "—")
                     + f" | {cell(f)} | {ratio} | {cell(a)} |")
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--db", required=True)
    run.add_argument("--run-id", default="mla")
    run.add_argument("--backends", default="flashmla,fa3-mla")
    run.add_argument("--heads", default="128")
    run.add_argument("--no-check", action="store_true", help="time only (the GPU tests check the kernels)")
    page = sub.add_parser("page")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", default="mla")
    page.add_argument("--script-log", default=None)
    page.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

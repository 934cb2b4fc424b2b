"""MLA decode through attnbench at FlashMLA's own benchmark shapes, beside that benchmark's numbers, and the
MLA kernels side by side at 16, 64 and 128 heads.

    python3 benchmarks/mla.py run  --db mla.db [--set flashmla|compare|compare-fa2|prefill] [--run-id ID]
                                   [--backends ...] [--heads 128]
    python3 benchmarks/mla.py page --db mla.db --script-log flashmla-bench.log [--compare-run mla-compare] [-o page.md]

The shapes are ``benchmark/bench_flash_mla.py``'s in deepseek-ai/FlashMLA: b = 128 requests, s_q = 1, h_q = 128
(``--heads``), one KV head, d = 576, dv = 512, causal, bf16, pages of 64, cache lengths ``L + 2·i`` for request i
with L = 1k, 2k, 4k, 8k, 16k, 32k, and its default softmax scale 1/√576. Its bytes and FLOPs are counted as
attnbench counts MLA (the same formulas: ``attnbench.metrics``). ``--script-log`` is the output of that script
run as its authors do (``python3 benchmark/bench_flash_mla.py --one --target flash_mla``); the page sets its
times beside attnbench's.

``--set compare`` (run id ``mla-compare``): every MLA kernel installed (FlashMLA, FlashInfer's MLA wrapper,
FlashAttention-3's ``qv`` path) at 16, 64 and 128 heads, 128 requests with mean caches of 1k to 64k, and 1 to 256
requests at 8k, each kernel on the same inputs and checked against the exact reference; the page gives time, the
latent cache read in GB/s and % of the device's measured read bandwidth (``attnbench calibrate`` into the same
store first), and TF/s. FlashInfer's wrapper runs its FA3 template there (``backend=fa3``); ``--set compare-fa2``
(run id ``mla-compare-fa2``) runs it again on its FA2 template, and the page sets both columns side by side.

``--set prefill`` (run id ``mla-prefill``): DeepSeek-V3's prefill as ordinary attention, 128 heads of q/k 192 and
v 128, causal, softmax scale 1/√192, bf16, 16k tokens a batch (1 × 16k to 16 × 1k), forward and forward+backward,
on every installed kernel that takes the head-size pair (FlashAttention-3 needs a build with it: 192 and 192/128).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCH = 128
KERNELS = ("flashmla", "flashinfer-mla", "fa3-mla")
COMPARE_HEADS = (16, 64, 128)
COMPARE = tuple((BATCH, n) for n in (1024, 4096, 16384, 65536)) + tuple((b, 8192) for b in (1, 16, 256))
"""(requests, shortest cache) of the comparison; request i caches n + 2·i tokens, as FlashMLA's benchmark."""
TEMPLATES = {"compare": "fa3", "compare-fa2": "fa2"}
"""The comparison sets and the FlashInfer template each pins (``flashinfer-mla.backend=``)."""
PREFILL_KERNELS = ("fa3", "fa4", "flex", "sdpa-cudnn", "sdpa-efficient")
PREFILL_TOKENS = 16384
PREFILL_LENGTHS = (1024, 4096, 16384)


def spec(heads: int, batch: int, n: int):
    from attnbench.spec import AttnSpec
    return AttnSpec(seqlens_q=(1,) * batch, seqlens_k=tuple(n + 2 * i for i in range(batch)), heads_q=heads,
                    heads_kv=1, head_dim=576, head_dim_v=512, dtype="bf16", causal=True, mla=True, page_size=64)


def specs(heads: int) -> list:
    return [spec(heads, BATCH, n) for n in LENGTHS]


def prefill_specs() -> list:
    from attnbench.spec import AttnSpec
    return [AttnSpec(batch=PREFILL_TOKENS // n, seqlens_q=(n,), heads_q=128, heads_kv=128, head_dim=192, head_dim_v=128,
                     dtype="bf16", causal=True, scale=192 ** -0.5, pass_=p)
            for p in ("fwd", "fwd_bwd") for n in PREFILL_LENGTHS]


def default_run_id(name: str) -> str:
    return {"flashmla": "mla", "prefill": "mla-prefill"}.get(name, f"mla-{name}")


def cmd_run(args) -> None:
    import subprocess
    import sys

    from attnbench import api
    default = {"flashmla": KERNELS[::2], "compare": KERNELS, "compare-fa2": ("flashinfer-mla",),
               "prefill": PREFILL_KERNELS}[args.set]
    options = {"backends": (args.backends or ",".join(default)).split(","), "db": args.db, "device": "cuda",
               "skip_missing": True, "check": not args.no_check}
    if args.set in TEMPLATES:
        options["backend_opt"] = [f"flashinfer-mla.backend={TEMPLATES[args.set]}"]
    plan = api.plan(**options, check=not args.no_check)
    if args.set in TEMPLATES:
        if args.calibrate:  # the device's read bandwidth into the store: the page's percentages
            subprocess.run([sys.executable, "-m", "attnbench", "calibrate", "--db", args.db], check=True)
        chosen = [spec(h, b, n) for h in COMPARE_HEADS for b, n in COMPARE]
    elif args.set == "prefill":
        chosen = prefill_specs()
    else:
        chosen = [s for h in args.heads.split(",") for s in specs(int(h))]
    plan = dataclasses.replace(plan, specs=chosen)
    run_id = args.run_id or default_run_id(args.set)
    records = api.run(plan, run_id=run_id, quiet=False)
    for r in records:
        print(line(r), flush=True)


def line(r) -> str:
    """A case's result in at most 100 columns: kernel, case, status, time and rates (or why it has none)."""
    s = r.spec
    case = (f"{s.heads_q} heads, {len(s.seqlens_k)} × {sum(s.seqlens_k) / len(s.seqlens_k):.0f}" if s.mla
            else f"{s.batch} × {s.seqlens_q[0]} {s.pass_}")
    result = (f"{r.median_ms * 1e3:9.1f} µs {r.gbps or 0:5.0f} GB/s {r.tflops or 0:4.0f} TF/s" if r.status == "ok"
              else (r.reason or "")[:40])
    return f"{column(r):<21} {case:<24} {r.status:<11} {result}"


def column(r) -> str:
    """A record's column: the kernel, and FlashInfer's template where one was pinned."""
    template = (r.info or {}).get("template")
    return r.backend + (f" ({template})" if template and template != "auto" else "")


def shown(r, text) -> str:
    """A table cell: "—" where the kernel does not take the case, the status where it has no time, else ``text()``
    and the check's verdict where it did not pass."""
    if r is None or r.status == "unsupported":
        return "—"
    if r.status != "ok":
        return r.status
    verdict = (r.accuracy or {}).get("verdict")
    return text() + ("" if verdict in ("pass", None) else f" ({verdict})")


def cell(r, read_gbps: float | None = None) -> str:
    """A decode cell: time, the latent read in GB/s (and % of the read bandwidth), TF/s."""
    return shown(r, lambda: f"{r.median_ms * 1e3:.0f} µs · {r.gbps:.0f} GB/s"
                 + (f" · {100 * r.gbps / read_gbps:.0f}%" if read_gbps else "") + f" · {r.tflops:.0f} TF/s")


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
    lines += compare_table(store, args.compare_run.split(","))
    lines += prefill_table(store, args.prefill_run)
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    print(text)


def stored(store, run_ids: list[str]) -> list:
    """The records of ``run_ids`` in order (a run not in the store has none)."""
    return [r for run_id in run_ids for r in store.records(run_id)]


def compare_table(store, run_ids: list[str]) -> list[str]:
    """The comparison runs as a table: a row per (heads, requests, mean cache), a column per kernel (and FlashInfer
    template); and why a kernel has no cell."""
    records = stored(store, run_ids)
    if not records:
        return []
    env = store.env(records[0].env_id) or {}
    read = store.peaks(env.get("device_name", "?")).get("read")
    read_gbps = float(read["value"]) if read else None
    by = {(column(r), r.spec): r for r in records}
    kernels = sorted({k for (k, _), r in by.items() if r.status != "unsupported"},
                     key=lambda k: (KERNELS.index(k.split()[0]) if k.split()[0] in KERNELS else len(KERNELS), k))
    runs = ", ".join(f"`{i}`" for i in run_ids)
    lines = ["", f"## The MLA kernels side by side (runs {runs})", "",
             "Each cell: median time, the latent cache read in GB/s"
             + (f" and % of the measured read bandwidth ({read_gbps:.0f} GB/s)" if read_gbps else "")
             + ", TF/s; every cell passed its check against the exact reference unless it says otherwise.", "",
             "| heads | requests | mean cache | " + " | ".join(f"`{k}`" for k in kernels) + " |",
             "|---:|---:|---:|" + "---:|" * len(kernels)]
    for s in dict.fromkeys(s for (_, s) in by):
        mean = sum(s.seqlens_k) / len(s.seqlens_k)
        lines.append(f"| {s.heads_q} | {len(s.seqlens_k)} | {mean:.0f} | "
                     + " | ".join(cell(by.get((k, s)), read_gbps) for k in kernels) + " |")
    return lines + missing(records)


def missing(records) -> list[str]:
    reasons = sorted({(column(r), r.status, (r.reason or "")[:150]) for r in records if r.status != "ok"})
    if not reasons:
        return []
    return ["", "Cells without a time, by kernel and reason:", ""] + [f"- `{b}` {status}: {reason}"
                                                                       for b, status, reason in reasons]


def prefill_table(store, run_id: str) -> list[str]:
    """The prefill run: a row per (pass, requests x length), a column per kernel: time and TF/s."""
    records = stored(store, [run_id])
    if not records:
        return []
    by = {(r.backend, r.spec): r for r in records}
    kernels = [k for k in dict.fromkeys(r.backend for r in records)
               if any(r.backend == k and r.status != "unsupported" for r in records)]
    lines = ["", f"## DeepSeek-V3 prefill: 128 heads, q/k 192, v 128, causal (run `{run_id}`)", "",
             "Each cell: median time and TF/s; every cell passed its check against the exact reference (output, and "
             "dQ/dK/dV for forward+backward) unless it says otherwise.", "",
             "| pass | sequences | " + " | ".join(f"`{k}`" for k in kernels) + " |", "|---|---:|" + "---:|" * len(kernels)]
    for s in sorted(dict.fromkeys(s for (_, s) in by), key=lambda s: (s.pass_ != "fwd", s.seqlens_q[0])):
        shape = f"{s.batch} × {s.seqlens_q[0]}"
        lines.append(f"| {s.pass_} | {shape} | " + " | ".join(prefill_cell(by.get((k, s))) for k in kernels) + " |")
    return lines + missing(records)


def prefill_cell(r) -> str:
    """A prefill cell: time (ms from 1 ms on) and TF/s."""
    return shown(r, lambda: (f"{r.median_ms:.2f} ms" if r.median_ms >= 1 else f"{r.median_ms * 1e3:.0f} µs")
                 + f" · {r.tflops:.0f} TF/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--db", required=True)
    run.add_argument("--set", choices=("flashmla", "compare", "compare-fa2", "prefill"), default="flashmla")
    run.add_argument("--run-id", default=None, help="default: mla (the flashmla set), mla-SET, mla-prefill")
    run.add_argument("--backends", default=None,
                     help="default: flashmla,fa3-mla (flashmla set), every MLA kernel (compare), the prefill kernels")
    run.add_argument("--heads", default="128", help="the flashmla set's head counts")
    run.add_argument("--no-check", action="store_true", help="time only (the GPU tests check the kernels)")
    run.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                     help="the store has this device's peaks already")
    page = sub.add_parser("page")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", default="mla")
    page.add_argument("--script-log", default=None)
    page.add_argument("--compare-run", default="mla-compare,mla-compare-fa2", help="comma-separated run ids")
    page.add_argument("--prefill-run", default="mla-prefill")
    page.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

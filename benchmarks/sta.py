"""Sliding tile attention side by side: the compiled kernel, the Triton kernel and FlexAttention on the same
STA mask, beside dense FlashAttention-3 and cuDNN on the same shape (what STA saves), over windows and the
three grids fastvideo-kernel's compiled kernel knows.

    python3 benchmarks/sta.py run  --db sta.db [--run-id sta] [--heads 24]
    python3 benchmarks/sta.py page --db sta.db [--run-id sta] -o page.md

Every STA case is checked against exact attention over the same (query, key) pairs (attnbench's reference
with the case's mask); TF/s count the attended pairs only (``metrics.flops``), so a sparse kernel's rate is
comparable with a dense one's. ``kept`` is the fraction of (query, key) pairs the mask keeps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

GRIDS = {
    # grid -> (text tokens, windows in tiles): windows the compiled kernel is built for, smallest to the whole grid
    (18, 48, 80): (0, ((3, 3, 3), (3, 3, 5), (3, 5, 9), (3, 6, 10))),
    (36, 48, 48): (0, ((3, 3, 3), (3, 6, 6), (6, 6, 6))),
    (30, 48, 80): (256, ((3, 3, 5), (5, 5, 7), (5, 6, 10))),
}
MIXED = ((3, 3, 5), (5, 5, 7), (5, 6, 10), (3, 6, 10))
"""Per-head windows of one more 30x48x80 case (head i takes MIXED[i % 4]): heads with different windows."""
STA_BACKENDS = ("sta", "sta-triton", "flex")
DENSE_BACKENDS = ("fa3", "sdpa-cudnn", "flex")


def specs(heads: int, head_dim: int = 128):
    from attnbench.spec import AttnSpec
    from attnbench.sta import TileMask
    out = []
    for grid, (text, windows) in GRIDS.items():
        cases = [(w,) for w in windows]
        if grid == (30, 48, 80):
            cases.append(tuple(MIXED[i % len(MIXED)] for i in range(heads)))
        for ws in cases:
            tm = TileMask(grid=grid, tile=(6, 8, 8), windows=ws, text=text)
            out.append(AttnSpec(seqlens_q=(tm.tokens,), heads_q=heads, head_dim=head_dim, dtype="bf16",
                                layout="bhsd", sta=tm))
    return out


def dense_specs(sta_specs):
    return list(dict.fromkeys(s.replace(sta=None) for s in sta_specs))


def cmd_run(args) -> None:
    import torch

    from attnbench import api
    if not torch.cuda.is_available():
        sys.exit("sta.py: needs a CUDA GPU (Hopper for the compiled kernel)")
    sta_specs = specs(args.heads)
    for backends, cases, suffix in ((STA_BACKENDS, sta_specs, ""), (DENSE_BACKENDS, dense_specs(sta_specs), "+dense")):
        plan = api.plan(backends=list(backends), db=args.db, device="cuda", skip_missing=True)
        # No compile-ahead workers: their FlexAttention compiles end in calls of these masks on the same GPU.
        # The runner keeps cases of 15 ms or more (at peak rate) away from them, but a slower kernel's shorter
        # case can still land beside them (sta-triton 18x48x80 3x3x3: 54 ms instead of 24); flex compiles in
        # its own untimed prepare instead.
        plan = dataclasses.replace(plan, specs=cases, options=dataclasses.replace(plan.options, compile_workers=0))
        run_id = args.run_id + suffix
        records = api.run(plan, run_id=run_id, quiet=False)
        print(f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases ok, stored as run {run_id}")


def _cell(rec) -> str:
    if rec is None:
        return "—"
    if rec.status != "ok":
        return rec.status
    return f"{rec.median_ms:.2f} ms · {rec.tflops:.0f} TF/s"


def cmd_page(args) -> None:
    from attnbench.results.store import ResultStore
    store = ResultStore(args.db, create=False, readonly=True)
    recs = {(r.backend, r.spec): r for rid in (args.run_id, args.run_id + "+dense") for r in store.records(rid)}
    if not recs:
        sys.exit(f"sta.py: no records of run {args.run_id} in {args.db}")
    first = next(iter(recs.values()))
    env = store.env(first.env_id) or {}
    run = store.run(args.run_id) or {}
    when = datetime.datetime.fromtimestamp(run.get("finished_at") or 0, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {packages[k]}" for k in ("fastvideo-kernel", "flash-attn-3", "triton", "torch")
                         if packages.get(k))
    sta_specs = sorted({s for _, s in recs if s.sta is not None}, key=lambda s: (s.sta.grid, s.sta.kept_fraction(s.heads_q)))
    lines = [f"# Sliding tile attention side by side: {env.get('device_name', '?')}", "",
             f"Runs `{args.run_id}` and `{args.run_id}+dense` of `{Path(args.db).name}`, finished {when}; "
             f"{versions}; CUDA {env.get('cuda', '?')}.", args.how or "", "",
             "B = 1, bf16, head size 128, (B, H, S, D) inputs; tiles 6×8×8 (384 tokens); windows in tiles. "
             "Time: median of the call; TF/s: attended pairs only (`metrics.flops`). Dense: the same shape "
             "without a mask. Speed-up: dense FA3's time over the STA kernel's. Every STA cell was checked "
             "against exact attention over the same pairs; `mismatch` would mean the kernel's mask or "
             "arithmetic is not the case's.", ""]
    head = ["grid", "text", "window", "kept", "sta (compiled)", "sta-triton", "flex (STA mask)", "dense fa3",
            "dense sdpa-cudnn", "dense flex", "speed-up sta / sta-triton"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for s in sta_specs:
        tm = s.sta
        dense = s.replace(sta=None)
        windows = "per head: " + ", ".join("x".join(map(str, w)) for w in dict.fromkeys(tm.windows)) \
            if len(tm.windows) > 1 else "x".join(map(str, tm.windows[0]))
        row = ["x".join(map(str, tm.grid)), str(tm.text), windows, f"{tm.kept_fraction(s.heads_q):.3f}"]
        row += [_cell(recs.get((b, s))) for b in STA_BACKENDS]
        row += [_cell(recs.get((b, dense))) for b in DENSE_BACKENDS]
        fa3 = recs.get(("fa3", dense))
        ups = []
        for b in ("sta", "sta-triton"):
            r = recs.get((b, s))
            ok = r is not None and r.status == "ok" and fa3 is not None and fa3.status == "ok"
            ups.append(f"{fa3.median_ms / r.median_ms:.2f}×" if ok else "—")
        row.append(" / ".join(ups))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Accuracy (output, max abs error against the exact reference; verdict):", ""]
    lines += ["| grid | window | backend | max abs err | verdict |", "|---|---|---|---:|---|"]
    for s in sta_specs:
        for b in STA_BACKENDS:
            r = recs.get((b, s))
            if r is None or not r.accuracy:
                continue
            out = (r.accuracy.get("tensors") or {}).get("out") or {}
            err = out.get("max_abs")
            windows = "mixed" if len(s.sta.windows) > 1 else "x".join(map(str, s.sta.windows[0]))
            lines.append(f"| {'x'.join(map(str, s.sta.grid))} | {windows} | `{b}` | "
                         f"{err:.2e} | {r.accuracy.get('verdict', '?')} |" if err is not None else
                         f"| {'x'.join(map(str, s.sta.grid))} | {windows} | `{b}` | — | {r.accuracy.get('verdict', '?')} |")
    not_ok = [(b, s, r) for (b, s), r in recs.items() if r.status != "ok"]
    if not_ok:
        lines += ["", "Cases without a time:", ""]
        lines += [f"- `{b}` {s.label()}: {r.status}: {r.reason}" for b, s, r in not_ok]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="time the STA and dense cases on this GPU into the store")
    run.add_argument("--db", required=True)
    run.add_argument("--run-id", default="sta")
    run.add_argument("--heads", type=int, default=24, help="query heads (default 24, HunyuanVideo's)")
    page = sub.add_parser("page", help="write the side-by-side page from stored records")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", default="sta")
    page.add_argument("-o", "--output", default=None)
    page.add_argument("--how", default=None, help="how the runs were made, for the page")
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

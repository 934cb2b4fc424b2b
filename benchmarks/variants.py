"""The attention of today's models on every kernel that runs it: gpt-oss's sinks (full and 128-token window
layers), Gemma 2's softcap (full and 4096-token window layers) and ALiBi, each beside the same kernel without the
variant (what the variant costs), forward and forward+backward, every case checked against the exact reference.

    python3 benchmarks/variants.py run  --db variants.db [--run-id variants] [--models gpt-oss-120b,...]
                                        [--backends flex,fa3,...] [--exclude fa4] [--suffix +fa4]
    python3 benchmarks/variants.py page --db variants.db [--run-id variants] -o page.md

Shapes are the models' attention layers (``attnbench.presets``) at B = 4 and S = 4k, 8k, 16k, 32k (16k to 128k
tokens a batch), bf16. ``run`` times one run per model (``RUN-ID+MODEL`` + ``--suffix``), so kernels that need
another Python environment (FA4 beside flash-attn 2) run in a second call with another suffix and the page
merges them. TF/s count the matmuls only (``attnbench.metrics``: softcap, ALiBi and sinks add no FLOPs), so a
variant's cost shows as a lower rate on the same count.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

MODELS = {
    # preset -> (what the variant is, the kernels that run it)
    "gpt-oss-120b": ("sinks", ("flex", "fa4", "flashinfer")),
    "gemma2-27b": ("softcap 50", ("flex", "fa4", "fa3", "flashinfer", "fa2")),
    "mpt-7b": ("ALiBi", ("flex", "fa4", "flashinfer", "fa2")),
}
DENSE_ONLY = ("fa3", "sdpa-cudnn")
"""Kernels timed without the variant too, as the dense yardstick (the fastest exact kernels of the default sweep)."""
LENGTHS = ("4k", "8k", "16k", "32k")
BATCH = 4


def model_specs(model: str, lengths=LENGTHS) -> list:
    """The preset's cases (every layer kind, both passes) with the variant and without it."""
    from attnbench import presets
    from attnbench.cli import common
    opts = presets.apply({"seq_lens": list(lengths), "batch_size": [str(BATCH)], "dtype": ["bf16"],
                          "pass_": ["fwd", "fwd_bwd"]}, model)
    with_variant = common.build_sweep(opts, "cuda").specs()
    plain = [s.replace(sinks=False, softcap=None, alibi=None) for s in with_variant]
    return list(dict.fromkeys(with_variant + plain))


def cmd_run(args) -> None:
    import torch

    from attnbench.accuracy.check import AccuracyChecker
    from attnbench.cli.run import execute, plan_from_options
    if not torch.cuda.is_available():
        sys.exit("variants.py: needs a CUDA GPU")
    for model in args.models.split(","):
        _, kernels = MODELS[model]
        backends = [b for b in (args.backends.split(",") if args.backends else (*kernels, *DENSE_ONLY))
                    if (b in kernels or b in DENSE_ONLY) and b not in args.exclude.split(",")]
        specs = model_specs(model, args.lengths.split(","))
        plan = plan_from_options({"backends": backends, "db": args.db, "device": "cuda", "skip_missing": True})
        plan = dataclasses.replace(plan, specs=specs)
        run_id, records, phases = execute(plan, run_id=f"{args.run_id}+{model}{args.suffix}",
                                          checker=AccuracyChecker(grads_ahead=True))
        ok = sum(r.status == "ok" for r in records)
        print(f"{model}: {ok}/{len(records)} cases ok in {phases['total']:.0f} s, stored as run {run_id}", flush=True)


def _records(store, run_ids: str) -> dict:
    """(backend, spec) -> record over the runs RUN_ID+MODEL and their suffixed siblings, for each of the
    comma-separated RUN_IDs (a later run's record of a case replaces an earlier one's)."""
    out = {}
    prefixes = tuple(f"{r}+" for r in run_ids.split(","))
    for run in store.runs():
        rid = run["run_id"]
        if rid.startswith(prefixes):
            for r in store.records(rid):
                out[(r.backend, r.spec)] = r
    return out


def _rate(r) -> str:
    if r is None:
        return "—"
    if r.status != "ok":
        return r.status
    verdict = (r.accuracy or {}).get("verdict")
    return f"{r.tflops:.0f}" + ("" if verdict in ("pass", None) else f" ({verdict})")


def _cost(plain, variant) -> str:
    if plain is None or variant is None or plain.status != "ok" or variant.status != "ok":
        return "—"
    return f"{variant.median_ms / plain.median_ms:.2f}×"


def _accuracy(r) -> str:
    acc = (r.accuracy or {}) if r is not None else {}
    worst = acc.get("worst")
    if not acc:
        return "—"
    if acc.get("verdict") != "pass":
        return f"**{acc.get('verdict')}**: {(acc.get('reason') or '')[:90]}"
    return f"{worst['ratio']:.2f} ({worst['tensor']} {worst['metric']})" if worst else "pass"


def cmd_page(args) -> None:
    from attnbench.results.store import ResultStore
    store = ResultStore(args.db, create=False, readonly=True)
    recs = _records(store, args.run_id)
    if not recs:
        sys.exit(f"variants.py: no records of runs {args.run_id}+... in {args.db}")
    first = next(iter(recs.values()))
    env = store.env(first.env_id) or {}
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))
    lines = [f"# Sinks, softcap and ALiBi on every kernel that runs them: {env.get('device_name', '?')}", "",
             f"Runs `{args.run_id}+*` of `{Path(args.db).name}` ({datetime.date.today().isoformat()}); "
             f"CUDA {env.get('cuda', '?')}; {versions}.", "", args.how or "", "",
             "TF/s: median call, matmul FLOPs of the attended pairs (the variants add none), so a variant's cost is "
             "a lower rate on the same count; **cost**: the kernel's time with the variant over its time without. "
             "Accuracy: the worst error / limit of the case with the variant (a pass is below 1; k × the error of "
             "PyTorch math in bf16 + a floor, the same verdict as every attnbench check).", ""]
    for model, (what, kernels) in MODELS.items():
        specs = sorted({s for (_, s) in recs if s.variants and _is_model(s, model)},
                       key=lambda s: (s.window or (-1, -1), s.pass_, s.seqlens_q))
        if not specs:
            continue
        lines += [f"## {model}: {what}", ""]
        head = ["layer", "pass", "S"] + [f"{k} (cost)" for k in kernels] + [f"{k} without" for k in DENSE_ONLY]
        lines += ["| " + " | ".join(head) + " |", "|---|---|---:|" + "---:|" * (len(head) - 3)]
        for s in specs:
            plain = s.replace(sinks=False, softcap=None, alibi=None)
            layer = "full" if not s.has_window else f"window {s.window[0] + 1}"
            row = [layer, s.pass_, f"{s.seqlens_q[0] // 1024}k"]
            for k in kernels:
                v, p = recs.get((k, s)), recs.get((k, plain))
                row.append(f"{_rate(v)} / {_rate(p)} ({_cost(p, v)})" if v is not None or p is not None else "—")
            row += [_rate(recs.get((k, plain))) for k in DENSE_ONLY]
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", f"Accuracy with {what} (worst error / limit):", "",
                  "| layer | pass | S | " + " | ".join(kernels) + " |", "|---|---|---:|" + "---|" * len(kernels)]
        for s in specs:
            layer = "full" if not s.has_window else f"window {s.window[0] + 1}"
            lines.append(f"| {layer} | {s.pass_} | {s.seqlens_q[0] // 1024}k | "
                         + " | ".join(_accuracy(recs.get((k, s))) for k in kernels) + " |")
        lines.append("")
    not_ok = sorted({(b, r.status, (r.reason or "")[:140]) for (b, s), r in recs.items() if r.status != "ok"})
    if not_ok:
        lines += ["Cases without a time, by backend and reason:", ""]
        lines += [f"- `{b}` {status}: {reason}" for b, status, reason in not_ok]
    templates = sorted({(b, r.info.get("template_ran")) for (b, s), r in recs.items() if r.info.get("template_ran")})
    if templates:
        lines += ["", "FlashInfer's template, as it chose: "
                  + ", ".join(f"{t}" for _, t in templates) + " (ALiBi runs on its FA2 template)."]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)


def _is_model(spec, model: str) -> bool:
    from attnbench import presets
    opts = presets.PRESETS[model].options
    return spec.heads_q == int(opts["q_heads"][0]) and spec.head_dim == int(opts["head_size"][0]) and \
        spec.heads_kv == int(opts.get("kv_heads", opts["q_heads"])[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="time the models' attention with and without their variant into the store")
    run.add_argument("--db", required=True)
    run.add_argument("--run-id", default="variants")
    run.add_argument("--models", default=",".join(MODELS))
    run.add_argument("--backends", default=None, help="only these kernels (default: the model's and the dense ones)")
    run.add_argument("--exclude", default="", help="kernels not to run here (run elsewhere, e.g. fa4)")
    run.add_argument("--lengths", default=",".join(LENGTHS))
    run.add_argument("--suffix", default="", help="appended to each run id (a second environment's runs)")
    page = sub.add_parser("page", help="write the page from stored records")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", default="variants", help="the runs' id, or several, comma-separated")
    page.add_argument("-o", "--output", default=None)
    page.add_argument("--how", default=None, help="how the runs were made, for the page")
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

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
import collections
import dataclasses
import datetime
import sys
import time
from pathlib import Path

MODELS = {
    # preset -> (what the variant is, the kernels that run it)
    "gpt-oss-120b": ("sinks", ("flex", "fa4", "flashinfer")),
    "gemma2-27b": ("softcap 50", ("flex", "fa4", "fa3", "flashinfer", "fa2")),
    "mpt-7b": ("ALiBi", ("flex", "fa4", "flashinfer", "fa2")),
}
VARIANT_OF = {"gpt-oss-120b": "sinks", "gemma2-27b": "softcap", "mpt-7b": "alibi"}
DENSE_ONLY = ("fa3", "sdpa-cudnn")
"""Kernels timed without the variant too, as the dense yardstick (the fastest exact kernels of the default sweep)."""
LENGTHS = ("4k", "8k", "16k", "32k")
BATCH = 4


def model_specs(model: str, lengths=LENGTHS) -> list:
    """The preset's cases (every layer kind, both passes) with the variant and without it."""
    from attnbench import api, presets
    opts = presets.apply({"seq_lens": list(lengths), "batch_size": [str(BATCH)], "dtype": ["bf16"],
                          "pass_": ["fwd", "fwd_bwd"]}, model)
    with_variant = api.plan(**opts, device="cpu").specs
    plain = [s.replace(sinks=False, softcap=None, alibi=None) for s in with_variant]
    return list(dict.fromkeys(with_variant + plain))


def cmd_run(args) -> None:
    import torch

    from attnbench import api
    if not torch.cuda.is_available():
        sys.exit("variants.py: needs a CUDA GPU")
    for model in args.models.split(","):
        _, kernels = MODELS[model]
        backends = [b for b in (args.backends.split(",") if args.backends else (*kernels, *DENSE_ONLY))
                    if (b in kernels or b in DENSE_ONLY) and b not in args.exclude.split(",")]
        specs = model_specs(model, args.lengths.split(","))
        plan = api.plan(backends=backends, db=args.db, device="cuda", skip_missing=True)
        plan = dataclasses.replace(plan, specs=specs)
        run_id, started = f"{args.run_id}+{model}{args.suffix}", time.perf_counter()
        records = api.run(plan, run_id=run_id, quiet=False)
        phases = {"total": time.perf_counter() - started}
        ok = sum(r.status == "ok" for r in records)
        print(f"{model}: {ok}/{len(records)} cases ok in {phases['total']:.0f} s, stored as run {run_id}", flush=True)


class Records(dict):
    """(backend, spec) -> record over the runs RUN_ID+MODEL and their suffixed siblings, for each of the
    comma-separated RUN_IDs: a later run's record of a case replaces an earlier one's, but ``pair`` takes the case
    without the variant from the variant's own run when that run has it (a cost is one run's ratio)."""

    def __init__(self, store, run_ids: str):
        super().__init__()
        self.by_run: dict[tuple, dict] = collections.defaultdict(dict)
        prefixes = tuple(f"{r}+" for r in run_ids.split(","))
        for run in store.runs():
            if run["run_id"].startswith(prefixes):
                for r in store.records(run["run_id"]):
                    self[(r.backend, r.spec)] = r
                    self.by_run[(r.backend, r.spec)][r.run_id] = r

    def pair(self, backend: str, spec):
        """(record with the variant, record of the same case without it, from one run where possible)."""
        variant, plain_spec = self.get((backend, spec)), spec.replace(sinks=False, softcap=None, alibi=None)
        same_run = variant is not None and self.by_run[(backend, plain_spec)].get(variant.run_id)
        return variant, same_run or self.get((backend, plain_spec))


def _rate(r) -> str:
    if r is None:
        return "—"
    if r.status == "mismatch":
        rel = (((r.accuracy or {}).get("tensors") or {}).get("out") or {}).get("rel_l2")
        return "mismatch" + (f" (out rel-L2 {rel:.2f})" if rel is not None else "")
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
    recs = Records(store, args.run_id)
    if not recs:
        sys.exit(f"variants.py: no records of runs {args.run_id}+... in {args.db}")
    first = next(iter(recs.values()))
    env = store.env(first.env_id) or {}
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))
    lines = [f"# Sinks, softcap and ALiBi on every kernel that runs them: {env.get('device_name', '?')}", "",
             f"Runs `{args.run_id}+*` of `{Path(args.db).name}` ({datetime.date.today().isoformat()}); "
             f"CUDA {env.get('cuda', '?')}; {versions}.", "",
             Path(args.notes).read_text().strip() if args.notes else "", "",
             "TF/s: median call, matmul FLOPs of the attended pairs (the variants add none), so a variant's cost is "
             "a lower rate on the same count; **cost**: the kernel's time with the variant over its time without. "
             "Accuracy: the worst error / limit of the case with the variant (a pass is below 1; k × the error of "
             "PyTorch math in bf16 + a floor, the same verdict as every attnbench check).", ""]
    shown = set()
    for model, (what, kernels) in MODELS.items():
        specs = sorted({s for (_, s) in recs if s.variants == (VARIANT_OF[model],) and _is_model(s, model)},
                       key=lambda s: (s.window or (-1, -1), s.pass_, s.seqlens_q))
        shown.update(specs)
        if not specs:
            continue
        lines += [f"## {model}: {what}", ""]
        head = ["layer", "pass", "S"] + [f"{k} (cost)" for k in kernels] + [f"{k} without" for k in DENSE_ONLY]
        lines += ["| " + " | ".join(head) + " |", "|---|---|---:|" + "---:|" * (len(head) - 3)]
        for s in specs:
            plain = s.replace(sinks=False, softcap=None, alibi=None)  # the dense kernels' case
            layer = "full" if not s.has_window else f"window {s.window[0] + 1}"
            row = [layer, s.pass_, f"{s.seqlens_q[0] // 1024}k"]
            for k in kernels:
                v, p = recs.pair(k, s)
                if v is None and p is None:
                    row.append("—")
                elif v is not None and p is not None and v.status == p.status != "ok":
                    row.append(v.status)  # e.g. no backward: the same with and without the variant
                else:
                    row.append(f"{_rate(v)} / {_rate(p)} ({_cost(p, v)})")
            row += [_rate(recs.get((k, plain))) for k in DENSE_ONLY]
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", f"Accuracy with {what} (worst error / limit):", "",
                  "| layer | pass | S | " + " | ".join(kernels) + " |", "|---|---|---:|" + "---|" * len(kernels)]
        for s in specs:
            layer = "full" if not s.has_window else f"window {s.window[0] + 1}"
            lines.append(f"| {layer} | {s.pass_} | {s.seqlens_q[0] // 1024}k | "
                         + " | ".join(_accuracy(recs.get((k, s))) for k in kernels) + " |")
        lines.append("")
    lines += _other_cases(recs, shown)
    not_ok = collections.Counter(
        (b, r.status, "its output is not the case's attention (the accuracy tables give the errors)"
         if r.status == "mismatch" else (r.reason or "")[:140]) for (b, s), r in recs.items() if r.status != "ok")
    if not_ok:
        lines += ["Cases without a usable time, by backend and reason:", ""]
        lines += [f"- `{b}` {status} ({n}): {reason}" for (b, status, reason), n in sorted(not_ok.items())]
    templates = collections.defaultdict(set)
    for (_, s), r in recs.items():
        if r.info.get("template_ran"):
            templates[", ".join(s.variants) or "no variant"].add(r.info["template_ran"])
    if templates:
        lines += ["", "FlashInfer's kernel template, as its `auto` chose it (`info.template_ran`): "
                  + "; ".join(f"{v}: {'/'.join(sorted(t))}" for v, t in sorted(templates.items())) + "."]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)


def _other_cases(recs: dict, shown: set) -> list[str]:
    """A table of the variant cases the model sections do not show (runs made with ``attnbench run``)."""
    others = sorted({s for (_, s) in recs if s.variants and s not in shown},
                    key=lambda s: (s.variants, s.pass_, s.seqlens_q))
    if not others:
        return []
    backends = sorted({b for (b, s) in recs if s in others})
    lines = ["## Other cases", "", "Each cell: TF/s with the variant / without it (cost), and the check's verdict.", "",
             "| case | " + " | ".join(backends) + " |", "|---|" + "---:|" * len(backends)]
    for s in others:
        cells = []
        for b in backends:
            v, p = recs.pair(b, s)
            cells.append(f"{_rate(v)} / {_rate(p)} ({_cost(p, v)})" if v is not None else "—")
        lines.append(f"| {s.label()} {s.pass_} | " + " | ".join(cells) + " |")
    return lines + [""]


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
    page.add_argument("--notes", default=None, help="a Markdown file put under the page's title (how the runs "
                      "were made, what they show)")
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

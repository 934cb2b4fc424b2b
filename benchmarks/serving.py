"""Serving batches on every serving kernel: the published anchors at their own shapes, a page-size sweep, a
mixed-batch sweep and fp8 KV caches against bf16, every batch checked against the exact per-request reference.

    python3 benchmarks/serving.py run  --db serving.db [--run-id serving] [--sets anchors,pages,mixed,fp8]
    python3 benchmarks/serving.py page --db serving.db [--run-id serving] -o page.md [--notes notes.md]

Sets (batches in attnbench's grammar, ``attnbench.serving``; 32 query heads of 128, bf16, causal, forward):

- ``anchors``: FlashInfer's cascade post (128 decodes over a 32k shared prefix + 256 own keys each, 32 KV heads,
  pages of 16) and its PR #2079's POD figure (2 prefills of 2048 + 128 decodes over 2048 keys, 8 KV heads, pages
  of 1), each on every kernel that takes the batch;
- ``pages``: 64 decodes over 1k..16k keys (8 KV heads) at pages of 1, 16, 64, 128, 256;
- ``mixed``: prefills of 2048 new tokens over 4k keys beside 128 decodes over 4k, from no prefill to prefills only;
- ``fp8``: 64 decodes over 2k..16k keys, bf16 KV cache and fp8 (one descale per tensor);
- ``long``: the same at 4k..32k keys, bf16 and fp8;
- ``cascade``: 32 to 256 decodes over the cascade post's 32k shared prefix (how the speedup grows with the batch);
- ``SET-fa2``: the set on ``flashinfer-paged`` pinned to FlashInfer's FA2 template; ``SET-tc``: on
  ``flashinfer-decode`` with ``use_tensor_cores`` (its tensor-core kernel, FlashInfer's FA2 prefill template).

``run`` takes every kernel installed here by default (FA4 needs its own environment: ``--backends fa4-paged``
there, into the same store under another run id, and both ids to ``page``).

``run`` first measures the device's read bandwidth (``attnbench calibrate``: the percentages are of it).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import subprocess
import sys
import time
from pathlib import Path

KERNELS = ("fa3-paged", "fa4-paged", "flashinfer-paged", "flashinfer-decode", "flashinfer-pod",
           "flashinfer-persistent", "flashinfer-cascade", "fa2-paged", "flex")
VARIANTS = {"fa2": ("flashinfer-paged", "backend=fa2"), "tc": ("flashinfer-decode", "use_tensor_cores=true")}
"""set suffix -> the one kernel it runs and the option it sets (the page's column: "KERNEL (SUFFIX)")."""
CASCADE_BATCHES = (32, 64, 128, 256)
MIXED = ("128q1kv4k", "1q2kkv4k_128q1kv4k", "2q2kkv4k_128q1kv4k", "4q2kkv4k_128q1kv4k", "8q2kkv4k_128q1kv4k",
         "16q2kkv4k_64q1kv4k", "16q2kkv4k")


def _specs(batch: str, heads_kv: int, **fields) -> list:
    from attnbench.serving import parse_batch
    from attnbench.spec import AttnSpec
    b = parse_batch(batch, seed=0)
    return [AttnSpec(seqlens_q=b.seqlens_q, seqlens_k=b.seqlens_k, heads_q=32, heads_kv=heads_kv, head_dim=128,
                     dtype="bf16", causal=True, **fields)]


def sets() -> dict[str, list]:
    out = {"anchors": _specs("128q1kv33024", 32, shared_prefix=32768, page_size=16)
           + _specs("2q2k_128q1kv2k", 8, page_size=1),
           "pages": [s for p in (1, 16, 64, 128, 256) for s in _specs("64q1kv1k..16k", 8, page_size=p)],
           "mixed": [s for m in MIXED for s in _specs(m, 8, page_size=16)],
           "fp8": [s for kv in (None, "fp8") for s in _specs("64q1kv2k..16k", 8, page_size=16, kv_dtype=kv)],
           "long": [s for kv in (None, "fp8") for s in _specs("64q1kv4k..32k", 8, page_size=16, kv_dtype=kv)],
           "cascade": [s for n in CASCADE_BATCHES
                       for s in _specs(f"{n}q1kv33024", 32, shared_prefix=32768, page_size=16)]}
    return out


def split_set(name: str) -> tuple[str, str | None]:
    """'fp8-tc' -> ('fp8', 'tc'); 'pages' -> ('pages', None)."""
    base, _, suffix = name.rpartition("-")
    return (base, suffix) if base and suffix in VARIANTS else (name, None)


def cmd_run(args) -> None:
    import torch

    from attnbench import api
    if not torch.cuda.is_available():
        sys.exit("serving.py: needs a CUDA GPU")
    if args.calibrate:  # the device's peaks (read bandwidth included) into the store: the page's percentages
        subprocess.run([sys.executable, "-m", "attnbench", "calibrate", "--db", args.db], check=True)
    from attnbench.backends import registry
    all_sets = sets()
    if args.backends:
        backends = args.backends.split(",")
    else:
        backends = [b for b in KERNELS if registry.get(b).unavailable_reason() is None]
        print(f"serving.py: kernels {', '.join(backends)}; not here: "
              f"{', '.join(b for b in KERNELS if b not in backends) or 'none'}", flush=True)
    for name in args.sets.split(","):
        base, variant = split_set(name)
        if base not in all_sets:
            sys.exit(f"serving.py: unknown set {name!r}; sets: {', '.join(all_sets)} (each also as SET-fa2, SET-tc)")
        options = {"backends": backends, "db": args.db, "device": "cuda", "skip_missing": True}
        if variant:  # one kernel with one option, e.g. FlashInfer's batched prefill on its FA2 template
            kernel, option = VARIANTS[variant]
            options |= {"backends": [kernel], "backend_opt": [f"{kernel}.{option}"]}
        plan = api.plan(**options)
        plan = dataclasses.replace(plan, specs=all_sets[base])
        run_id, started = f"{args.run_id}+{name}", time.perf_counter()
        records = api.run(plan, run_id=run_id, quiet=False)
        phases = {"total": time.perf_counter() - started}
        ok = sum(r.status == "ok" for r in records)
        print(f"{name}: {ok}/{len(records)} cases ok in {phases['total']:.0f} s, stored as run {run_id}", flush=True)


def _tokens(spec) -> int:
    return sum(sq for sq, _ in spec.sequences)


def _cell(r, read_gbps: float | None, what: str) -> str:
    from attnbench import metrics
    if r is None or r.status == "unsupported":
        return "—"
    if r.status != "ok":
        return r.status
    verdict = (r.accuracy or {}).get("verdict")
    mark = ("" if verdict in ("pass", None) else f" ({verdict})") + (" †" if r.info.get("compile_workers_busy") else "")
    if what == "kv":
        gbps = metrics.kv_bytes(r.spec) / (r.median_ms * 1e-3) / 1e9
        pct = f" · {100 * gbps / read_gbps:.0f}%" if read_gbps else ""
        return f"{r.median_ms * 1e3:.0f} µs · {gbps:.0f} GB/s{pct}{mark}"
    return f"{r.median_ms * 1e3:.0f} µs · {r.tflops:.0f} TF/s · {_tokens(r.spec) / r.median_ms / 1e3:.1f} Mtok/s{mark}"


def cmd_page(args) -> None:
    from attnbench.results.store import ResultStore
    store = ResultStore(args.db, create=False, readonly=True)
    recs: dict = {}
    prefixes = tuple(f"{r}+" for r in args.run_id.split(","))
    skipped_runs = set(args.skip.split(",")) if args.skip else set()
    runs = sorted((r for r in store.runs() if r["run_id"].startswith(prefixes) and r["run_id"] not in skipped_runs),
                  key=lambda r: prefixes.index(r["run_id"].split("+", 1)[0] + "+"))
    for run in runs:  # a later run id's record of a case replaces an earlier one's
        base, variant = split_set(run["run_id"].split("+", 1)[1])
        for r in store.records(run["run_id"]):
            ran = variant or ("tc" if r.info.get("use_tensor_cores") else None)  # the column says what ran
            recs[(base, r.backend + (f" ({ran})" if ran else ""), r.spec)] = r
    if not recs:
        sys.exit(f"serving.py: no records of runs {args.run_id}+... in {args.db}")
    first = next(iter(recs.values()))
    env = store.env(first.env_id) or {}
    device = env.get("device_name", "?")
    stored = store.peaks(device)
    read = float(stored["read"]["value"]) if "read" in stored else None
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))
    lines = [f"# Serving batches on every serving kernel: {device}", "",
             f"Runs `{args.run_id}+*` of `{Path(args.db).name}` ({datetime.date.today().isoformat()}); "
             f"CUDA {env.get('cuda', '?')}; {versions}." + (f" Measured read bandwidth {read:.0f} GB/s (a sum over "
                                                            "2 GiB, `attnbench calibrate`)." if read else ""), "",
             Path(args.notes).read_text().strip() if args.notes else "", "",
             "Each cell: median time per batch, then the rate the batch is judged by — decode-dominated batches the "
             "KV cache read (distinct bytes: a shared prefix once, fp8 at one byte) in GB/s and % of the measured "
             "read bandwidth; the others TF/s of the attended pairs and new tokens per second. Every batch is "
             "checked against the exact reference per request; a cell says when the check did not pass. † : timed while "
             "compile-ahead workers were preparing other cases on the same GPU (`info.compile_workers_busy`). "
             "Columns: `flashinfer-paged (fa2)` is the prefill wrapper pinned to FlashInfer's FA2 template, "
             "`flashinfer-decode (tc)` the decode wrapper on tensor cores (`use_tensor_cores`).", ""]
    for name, title, what in (("anchors", "Published anchors at their own shapes", "both"),
                              ("pages", "Page size (64 decodes over 1k–16k keys, 32/8 heads)", "kv"),
                              ("mixed", "Mixed batches (prefills of 2048 over 4k beside decodes over 4k, pages of 16)",
                               "flops"),
                              ("fp8", "fp8 KV cache against bf16 (64 decodes over 2k–16k keys, pages of 16)", "kv"),
                              ("long", "fp8 KV cache against bf16 at longer caches (64 decodes over 4k–32k keys, "
                               "pages of 16)", "kv"),
                              ("cascade", "A shared prefix of 32768 tokens as the batch grows (decodes with 256 keys "
                               "of their own, 32 heads, pages of 16)", "kv")):
        specs = list(dict.fromkeys(s for (n, _, s) in recs if n == name))
        if not specs:
            continue
        columns = [c for b in KERNELS for c in (b, *(f"{b} ({v})" for v, (k, _) in VARIANTS.items() if k == b))]
        backends = [b for b in columns if any((name, b, s) in recs and recs[(name, b, s)].status != "unsupported"
                                              for s in specs)]  # a kernel that takes none of the set: no column
        lines += [f"## {title}", "", "| batch | " + " | ".join(backends) + " |", "|---|" + "---:|" * len(backends)]
        for s in specs:
            kind = what if what != "both" else ("kv" if set(s.seqlens_q) == {1} or s.shared_prefix else "flops")
            lines.append(f"| {_batch_label(s)} | " + " | ".join(_cell(recs.get((name, b, s)), read, kind)
                                                            for b in backends) + " |")
        lines.append("")
    lines += _append_table(recs)
    not_ok = collections.Counter((b, r.status, (r.reason or "")[:150]) for (_, b, _), r in recs.items()
                                 if r.status not in ("ok", "unsupported"))
    if not_ok:
        lines += ["Cases without a usable time, by backend and reason:", ""]
        lines += [f"- `{b}` {status} ({n}): {reason}" for (b, status, reason), n in sorted(not_ok.items())]
    skipped = collections.Counter((b, (r.reason or "")[:150]) for (_, b, _), r in recs.items()
                                  if r.status == "unsupported")
    if skipped:
        lines += ["", "Batches a kernel does not take (—), by reason:", ""]
        lines += [f"- `{b}` ({n}): {reason}" for (b, reason), n in sorted(skipped.items())]
    templates = collections.defaultdict(set)
    plans = collections.defaultdict(list)
    for (_, b, _), r in recs.items():
        if r.info.get("template_ran"):
            templates[b].add(r.info["template_ran"])
        if r.info.get("plan_ms") is not None:
            plans[b].append(r.info["plan_ms"])
    if templates:
        lines += ["", "Templates that ran (`info.template_ran`): "
                  + "; ".join(f"`{b}` {'/'.join(sorted(t))}" for b, t in sorted(templates.items())) + "."]
    if plans:
        lines += ["", "Planning, outside the timed call (`info.plan_ms`, a server pays it every step): "
                  + "; ".join(f"`{b}` {min(v):.2f}–{max(v):.2f} ms" for b, v in sorted(plans.items())) + "."]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)


def _append_table(recs: dict) -> list[str]:
    """The step's cache write (``info.append``, timed apart) beside the attention, for the anchors and the fp8 set:
    one row per batch, the write's median over the kernels that timed it (the same write for each: the cache layout
    is shared) and the fastest kernel's attention."""
    rows = []
    for name in ("anchors", "fp8", "long"):
        for spec in dict.fromkeys(s for (n, _, s) in recs if n == name):
            timed = [r for (n, _, s), r in recs.items() if n == name and s == spec and r.status == "ok"]
            writes = sorted(r.info["append"]["median_ms"] for r in timed if "append" in r.info)
            if not writes:
                continue
            write = writes[len(writes) // 2]
            best = min(timed, key=lambda r: r.median_ms)
            how = timed[0].info["append"]["how"] if "append" in timed[0].info else ""
            rows.append(f"| {_batch_label(spec)} | {_tokens(spec)} | {write * 1e3:.1f} | {best.median_ms * 1e3:.0f} "
                        f"(`{best.backend}`) | {100 * write / (write + best.median_ms):.0f}% | {how} |")
    if not rows:
        return []
    return ["## Writing the step's new tokens into the cache", "",
            "Before its attention a server writes each request's new keys and values into their cache slots (an fp8 "
            "cache quantizes them first). attnbench times that write apart (`info.append`): PyTorch's "
            "`index_copy_` through the page table, after the quantization's own kernels for fp8 — what a server "
            "without a fused write pays (vLLM's `reshape_and_cache_flash` and FlashInfer's `append_paged_kv_cache` "
            "are one launch).", "",
            "| batch | new tokens | write µs | fastest attention µs | write's share of the step | how |",
            "|---|---:|---:|---:|---:|---|", *rows, ""]


def _batch_label(spec) -> str:
    from attnbench.serving import describe
    parts = [describe(spec.seqlens_q, spec.seqlens_k), f"h{spec.heads_q}/{spec.heads_kv}"]
    if spec.shared_prefix:
        parts.append(f"prefix {spec.shared_prefix}")
    if spec.kv_dtype:
        parts.append(f"kv {spec.kv_dtype}")
    if spec.page_size:
        parts.append(f"page {spec.page_size}")
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="time the sets into the store")
    run.add_argument("--db", required=True)
    run.add_argument("--run-id", default="serving")
    run.add_argument("--sets", default="anchors,anchors-fa2,pages,mixed,fp8,fp8-tc,long,long-tc,cascade")
    run.add_argument("--backends", default=None, help="only these kernels (default: every serving kernel)")
    run.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                     help="the store has this device's peaks already")
    page = sub.add_parser("page", help="write the page from stored records")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", default="serving", help="the runs' id, or several, comma-separated (a later one's "
                      "record of a case replaces an earlier one's)")
    page.add_argument("--skip", default="", help="runs to leave out (comma-separated ids: e.g. a set run again at "
                      "other shapes)")
    page.add_argument("-o", "--output", default=None)
    page.add_argument("--notes", default=None, help="a Markdown file put under the page's title")
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()

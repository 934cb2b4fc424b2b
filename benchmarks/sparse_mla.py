"""FlashMLA's sparse kernels checked against the exact reference over the selected tokens, and timed.

    python3 benchmarks/sparse_mla.py [--out DIR] [--quick]

Needs a Hopper GPU and the FlashMLA wheel (``flash_mla``). Cases, each checked (out and LSE against
``sparse.reference.reference_sparse`` in fp32 with TF32 off, over exactly the selected tokens; the FP8 decode against
the reference of the dequantized cache rows, which are the values the kernel computes with) and then timed with
CUDA events and a cold L2 (attnbench's own timer, median):

- sparse prefill at FlashMLA's README shape: s_q 4096, 128 (and 64) heads, top-k 2048, a cache of 8192 rows,
  indices from the lightning indexer's reference (the high-scoring tokens) and random ones;
- sparse prefill with empty slots, repeated indices, per-query top-k lengths and a sink (what the check covers);
- sparse FP8 decode (V3.2's 656-byte rows): b 128, s_q 2, 128 heads, top-k 2048, cache 8192 per request.

TFLOP/s count the selected tokens: 2 · h_q · Σ valid slots · (576 + 512) (``sparse.counts``). One line per case and a
JSON file under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnbench.accuracy.compare import compare  # noqa: E402
from attnbench.sparse import flashmla, fp8  # noqa: E402
from attnbench.sparse.counts import sparse_counts  # noqa: E402
from attnbench.sparse.indices import make_case  # noqa: E402
from attnbench.sparse.reference import Selection, reference_sparse  # noqa: E402
from attnbench.timing import TimingConfig, measure  # noqa: E402


def timed_ms(fn) -> float:
    samples = measure(fn, TimingConfig(warmup=5, repeat=30), "cuda")
    return float(sorted(samples)[len(samples) // 2])


def checked(name: str, got, ref, extra: dict) -> dict:
    metrics = compare(got.tensors(), ref.tensors())
    out = metrics["out"]
    row = {"case": name, "out_rel_l2": out["rel_l2"], "out_max_abs": out["max_abs"],
           "lse_max_abs": metrics.get("lse", {}).get("max_abs"), **extra}
    row["pass"] = out["rel_l2"] < 8e-3  # bf16 output: a few round-offs (2^-8 = 3.9e-3 per element)
    return row


def prefill(name: str, s_q: int, s_kv: int, heads: int, topk: int, pattern: str, **kw) -> dict:
    case = make_case(s_q, s_kv, heads, topk, pattern=pattern, device="cuda", **kw)
    call = flashmla.sparse_prefill(case.q, case.kv, case.selection, scale=case.scale, d_v=case.d_v,
                                   attn_sink=case.attn_sink)
    got = call()
    torch.cuda.synchronize()
    ref = reference_sparse(case.q, case.kv, case.selection, scale=case.scale, d_v=case.d_v, attn_sink=case.attn_sink)
    ref = ref.replace(max_logits=None)
    got = got.replace(max_logits=None)
    counts = sparse_counts(case.selection, s_kv, heads=heads, pass_="fwd")
    ms = timed_ms(call)
    return checked(name, got, ref, {"ms": ms, "tflops": counts.flops / ms / 1e9,
                                    "dense_tflops_equiv": counts.dense_flops / ms / 1e9,
                                    "valid_slots": counts.slots, "s_q": s_q, "s_kv": s_kv, "heads": heads,
                                    "topk": topk, "pattern": pattern})


def decode(name: str, b: int, s_q: int, s_kv: int, heads: int, topk: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b * s_q, heads, 576, generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn(b * s_kv, 576, generator=gen, device="cuda").to(torch.bfloat16)
    # each request attends top-k of its own cache rows (request r owns rows r·s_kv ... (r+1)·s_kv - 1)
    own = torch.randint(0, s_kv, (b * s_q, topk), generator=gen, device="cuda", dtype=torch.int32)
    base = (torch.arange(b * s_q, device="cuda") // s_q * s_kv).to(torch.int32).unsqueeze(1)
    selection = Selection(indices=own + base)
    rows = fp8.quantize_rows(kv)
    call = flashmla.sparse_decode(q.view(b * s_q, heads, 576), rows, selection, requests=b, scale=576 ** -0.5)
    got = call()
    torch.cuda.synchronize()
    ref = reference_sparse(q, fp8.dequantize_rows(rows), selection, scale=576 ** -0.5, d_v=512)
    counts = sparse_counts(selection, b * s_kv, heads=heads, pass_="fwd", row_bytes=fp8.ROW_BYTES)
    ms = timed_ms(call)
    return checked(name, got.replace(max_logits=None), ref.replace(max_logits=None),
                   {"ms": ms, "tflops": counts.flops / ms / 1e9, "gbps": counts.bytes / ms / 1e6, "b": b,
                    "s_q": s_q, "s_kv": s_kv, "heads": heads, "topk": topk})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("sparse-mla"))
    p.add_argument("--quick", action="store_true", help="the README shapes only")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import flash_mla  # noqa: F401  (fail early, with the import's own message)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    jobs = [
        lambda: prefill("prefill h128 indexer", 4096, 8192, 128, 2048, "indexer"),
        lambda: prefill("prefill h128 random", 4096, 8192, 128, 2048, "random"),
        lambda: prefill("prefill h64 random", 4096, 8192, 64, 2048, "random"),
        lambda: decode("fp8 decode b128 s_q2 h128", 128, 2, 8192, 128, 2048),
    ]
    if not args.quick:
        jobs += [
            lambda: prefill("prefill h64 empty+repeats+lengths+sink", 257, 1000, 64, 256, "random", empty=0.2,
                            repeats=0.1, lengths=True, attn_sink=True),
            lambda: decode("fp8 decode b32 s_q1 h64", 32, 1, 4096, 64, 2048),
        ]
    rows = []
    for job in jobs:
        started = time.perf_counter()
        try:
            row = job()
        except Exception as exc:  # a kernel's refusal: one line, the next case still runs
            row = {"case": getattr(job, "__name__", "?"), "error": f"{type(exc).__name__}: {exc}"[:300]}
        row["wall_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "sparse_mla.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("pass") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

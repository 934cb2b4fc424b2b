"""SageAttention (v1, Triton) speed against accuracy, with and without quantization in the timed region.

``sageattn`` quantizes inside the call (K smoothing, per-block INT8 of Q and K, V to fp16), so the
kernel alone cannot be reached through it. sageattention 1.x exposes the pieces it calls:
``sageattention.quant_per_block.per_block_int8(q, k, sm_scale=, tensor_layout=)`` and
``sageattention.attn_qk_int8_per_block[_causal].forward(q_int8, k_int8, v, q_scale, k_scale, ...)``.
This script times, per sequence length and causal flag:

* ``sage`` - the whole ``sageattn`` call (what a model pays);
* ``sage-quant`` - smoothing + quantization alone;
* ``sage-kernel`` - the INT8 attention kernel on pre-quantized inputs (quantization *outside* the timed region);
* ``sdpa-flash`` in the same dtype, as the speed baseline;

and measures accuracy against the exact blocked fp32 reference: cosine, rel-L1, RMSE for ``sage``
(smooth_k on and off) and ``sdpa-flash``. It writes a JSON table and a PNG (TFLOP/s against rel-L1;
time split into quantization and kernel). GPU only; ``--replot`` redraws the PNG from a JSON anywhere.
Results on an H200: docs/results/2026-11-22-h200-end-to-end.md.

    PYTHONPATH=src python3 benchmarks/sage_tradeoff.py --out sage_tradeoff  # -> sage_tradeoff.{json,png}
    python3 benchmarks/sage_tradeoff.py --replot sage_tradeoff.json         # -> sage_tradeoff.png
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from attnbench import metrics
from attnbench.accuracy.reference import attention_forward
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig, measure, summarize


def accuracy(out: torch.Tensor, ref: torch.Tensor) -> dict:
    a, b = out.double().flatten(), ref.double().flatten()
    return {"cosine": F.cosine_similarity(a, b, dim=0).item(),
            "rel_l1": ((a - b).abs().sum() / b.abs().sum()).item(),
            "rmse": (a - b).square().mean().sqrt().item()}


def case(seq: int, causal: bool, args) -> list[dict]:
    from sageattention import sageattn
    from sageattention.attn_qk_int8_per_block import forward as attn_plain
    from sageattention.attn_qk_int8_per_block_causal import forward as attn_causal
    from sageattention.quant_per_block import per_block_int8
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.batch, args.heads, seq, args.head_dim)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=dtype) for _ in range(3))
    spec = AttnSpec(batch=args.batch, seqlens_q=(seq,), heads_q=args.heads, head_dim=args.head_dim,
                    dtype={"float16": "fp16", "bfloat16": "bf16"}[args.dtype], causal=causal)
    flop = metrics.flops(spec)
    # The blocked exact reference (fp32, TF32 off, no S x S matrix: a dense fp32 reference ran out of
    # memory at S = 32k on an H200), back in the (B, H, S, D) layout the kernels here use.
    out_bshd, _ = attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    ref = out_bshd.transpose(1, 2)

    def quantize():  # what sageattn does before its kernel (smooth_k on a copy: it is in place)
        km = k.mean(dim=2, keepdim=True)
        return per_block_int8(q, k - km, tensor_layout="HND"), v.to(torch.float16)
    (q8, qs, k8, ks), v16 = quantize()
    kernel = attn_causal if causal else attn_plain
    fns = {
        "sdpa-flash": lambda: _flash(q, k, v, causal),
        "sage": lambda: sageattn(q, k.clone(), v, tensor_layout="HND", is_causal=causal),
        "sage-quant": quantize,
        "sage-kernel": lambda: kernel(q8, k8, v16, qs, ks, tensor_layout="HND", output_dtype=dtype),
    }
    timing = TimingConfig(warmup=5, repeat=args.repeat)
    rows = []
    for name, fn in fns.items():
        stats = summarize(measure(fn, timing, "cuda"))
        row = {"name": name, "seq": seq, "causal": causal, "median_ms": stats["median_ms"],
               "quant_in_timed_region": name == "sage"}
        if name != "sage-quant":  # quantization alone does no attention FLOPs
            row["tflops"] = metrics.tflops_per_s(flop, stats["median_ms"])
        if name in ("sdpa-flash", "sage", "sage-kernel"):
            row |= accuracy(fn(), ref)
        rows.append(row)
    no_smooth = sageattn(q, k.clone(), v, tensor_layout="HND", is_causal=causal, smooth_k=False)
    rows.append({"name": "sage-no-smooth-k", "seq": seq, "causal": causal} | accuracy(no_smooth, ref))
    return rows


def _flash(q, k, v, causal):
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, marker in (("sdpa-flash", "o"), ("sage", "s"), ("sage-kernel", "^")):
        pts = [r for r in rows if r["name"] == name and "rel_l1" in r]
        ax1.scatter([r["rel_l1"] for r in pts], [r["tflops"] for r in pts], marker=marker, label=name)
    ax1.set_xscale("log")
    ax1.set(xlabel="rel-L1 vs fp32 reference", ylabel="TFLOP/s (attnbench convention)", title="speed vs accuracy")
    ax1.legend()
    for causal, style in ((False, "-"), (True, "--")):
        for name in ("sdpa-flash", "sage", "sage-quant", "sage-kernel"):
            pts = sorted((r["seq"], r["median_ms"]) for r in rows if r["name"] == name and r["causal"] == causal)
            ax2.plot(*zip(*pts, strict=True), style, marker="o", label=f"{name}{' causal' if causal else ''}")
    ax2.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="ms", title="quantization vs kernel time")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=30)
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 128))
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default="sage_tradeoff")
    ap.add_argument("--replot", metavar="JSON", help="Only redraw the PNG (next to JSON) from a saved table.")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as fh:
            plot(json.load(fh)["rows"], args.replot.removesuffix(".json") + ".png")
        return
    if not torch.cuda.is_available():
        raise SystemExit("sage_tradeoff needs a CUDA device")
    rows = [r for seq in args.seq_lens for causal in (False, True) for r in case(seq, causal, args)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)}
    with open(args.out + ".json", "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=2)
    plot(rows, args.out + ".png")
    for r in rows:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()

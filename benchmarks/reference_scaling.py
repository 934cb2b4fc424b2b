"""Time and memory of the exact reference (forward + backward) on one long sequence.

Target on an H100/H200: S = 65536, B = 1, H = 16, D = 128 in <= 10 s with <= 4 GB of device memory
above what the inputs take (a materialised S x S fp32 score matrix per head would need 256 GB).

    PYTHONPATH=src python3 benchmarks/reference_scaling.py                      # the target case, CUDA
    PYTHONPATH=src python3 benchmarks/reference_scaling.py --causal --json      # one JSON line
    PYTHONPATH=src python3 benchmarks/reference_scaling.py --device cpu --seq-len 2048 --heads 4   # smoke test
    PYTHONPATH=src python3 benchmarks/reference_scaling.py --causal --sinks --softcap 50 --alibi   # with the variants

The reference runs in fp32 (TF32 off) on CUDA for 16-bit inputs and in fp64 on the CPU
(``--compute-dtype`` overrides).
A small warm-up call first takes cuBLAS initialisation out of the timed call.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from attnbench import features
from attnbench.accuracy.reference import BlockSizes, attention_backward, attention_forward, compute_dtype_for
from attnbench.features.alibi import alibi_slopes
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

TARGET_SECONDS = 10.0
TARGET_BYTES = 4 * 10 ** 9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    p.add_argument("--seq-len", type=int, default=65536, help="query = key length (default: 65536)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16, help="query heads")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: = heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", help="dtype of the inputs (default: bf16)")
    p.add_argument("--compute-dtype", choices=("fp32", "fp64"), default=None,
                   help="reference precision (default: fp32 on CUDA, fp64 on CPU)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--sinks", action="store_true", help="attention sinks (and their gradient)")
    p.add_argument("--softcap", type=float, default=None, help="logit softcap C")
    p.add_argument("--alibi", action="store_true", help="ALiBi with the standard slopes")
    p.add_argument("--block-q", type=int, default=BlockSizes().q, help="query rows per block")
    p.add_argument("--block-k", type=int, default=BlockSizes().k, help="keys per block")
    p.add_argument("--max-block-elems", type=int, default=BlockSizes().max_elems,
                   help="cap on B*H*rows*keys of one score block")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    return p.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_reference(spec: AttnSpec, device: torch.device, dtype: torch.dtype, blocks: BlockSizes) -> dict:
    """One timed fwd+bwd of the reference; seconds per phase and extra device memory (CUDA)."""
    inputs = make_inputs(spec, device, seed=0)
    feats = {f.name: (getattr(spec, f.name) if f.stage == "score" else inputs.extra[f.name])
             for f in features.active(spec) if f.stage != "output"}
    kw = dict(causal=spec.causal, scale=spec.softmax_scale, dtype=dtype, blocks=blocks, features=feats)
    cuda = device.type == "cuda"
    if cuda:
        small = make_inputs(spec.replace(seqlens_q=(256,)), device, seed=1)
        o, lse = attention_forward(small.q, small.k, small.v, **kw)  # warm-up: cuBLAS handles, kernels
        attention_backward(small.q, small.k, small.v, o, lse, small.dout, **kw)
        del small, o, lse
        _sync(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    out, lse = attention_forward(inputs.q, inputs.k, inputs.v, **kw)
    _sync(device)
    t1 = time.perf_counter()
    grads = attention_backward(inputs.q, inputs.k, inputs.v, out, lse, inputs.dout, **kw)
    dq, dk, dv = grads["dq"], grads["dk"], grads["dv"]
    _sync(device)
    t2 = time.perf_counter()
    finite = all(bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv))
    extra = torch.cuda.max_memory_allocated(device) - base if cuda else None
    return {"fwd_s": t1 - t0, "bwd_s": t2 - t1, "total_s": t2 - t0, "extra_bytes": extra, "finite": finite}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu with a smaller --seq-len", file=sys.stderr)
        return 2
    spec = AttnSpec(batch=args.batch, seqlens_q=(args.seq_len,), heads_q=args.heads, heads_kv=args.kv_heads,
                    head_dim=args.head_dim, dtype=args.dtype, causal=args.causal, pass_="fwd_bwd", sinks=args.sinks,
                    softcap=args.softcap, alibi=alibi_slopes(args.heads) if args.alibi else None)
    dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(args.compute_dtype) or compute_dtype_for(device, spec.torch_dtype)
    blocks = BlockSizes(q=args.block_q, k=args.block_k, max_elems=args.max_block_elems)
    res = run_reference(spec, device, dtype, blocks)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    row = {"device": name, "torch": torch.__version__, "case": spec.label(), "compute_dtype": str(dtype),
           "block_q": blocks.q, "block_k": blocks.k, **res,
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": " ".join(["reference_scaling.py", *sys.argv[1:]])}
    within = res["total_s"] <= TARGET_SECONDS and (res["extra_bytes"] is None or res["extra_bytes"] <= TARGET_BYTES)
    row["within_target"] = within if device.type == "cuda" else None
    if args.json:
        print(json.dumps(row))
    else:
        mem = "n/a (cpu)" if res["extra_bytes"] is None else f"{res['extra_bytes'] / 1e9:.2f} GB"
        print(f"{name}: {spec.label()} exact reference fwd+bwd in {str(dtype).removeprefix('torch.')}, "
              f"blocks {blocks.q}x{blocks.k}")
        print(f"forward {res['fwd_s']:.2f} s, backward {res['bwd_s']:.2f} s, total {res['total_s']:.2f} s; "
              f"extra device memory {mem}; finite: {res['finite']}")
        if device.type == "cuda":
            print(f"target <= {TARGET_SECONDS:.0f} s and <= {TARGET_BYTES / 1e9:.0f} GB: {'met' if within else 'NOT met'}")
    return 0 if res["finite"] and row["within_target"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())

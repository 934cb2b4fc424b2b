"""FlashMLA's own test scripts timing its sparse kernels at their V3.2 performance cases: the numbers to set beside
``attnbench run`` at the same shapes on the same GPU (``benchmarks/sparse_authors.sh`` runs both).

    python3 benchmarks/flashmla_own.py --tests PATH/TO/FlashMLA/tests [--caches 8192 32768 ...] [--batches 2 64 ...]

Imports FlashMLA's ``tests/`` (deepseek-ai/FlashMLA @9241ae3, with its ``kernelkit``) and times, as its own
``test_flash_mla_sparse_prefill.py`` and ``test_flash_mla_sparse_decoding.py`` do (kineto kernel time; before each
call an 8 GB memset that flushes L2 and lets the GPU cool): the prefill's V3.2 performance cases (s_q 4096, 128
heads, top-k 2048, d_qk 576, an attention sink, random distinct indices over every one of s_kv rows, caches
``--caches``) and the FP8 decode's (b ``--batches``, 128 heads, s_q 2, 32768 rows, top-k 2048, a sink; their
cases have varied cache lengths, ``is_varlen``, and this script also times fixed ones, attnbench's shape). Their
TFLOP/s count every slot. Each case's correctness check of theirs runs once, and the GPU's SM clock, power and
temperature are sampled across the timed calls (NVML, ``attnbench.timing.clocks``). One JSON line per case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def _sampled(fn):
    """fn() with the GPU's state sampled across it: (result, window summary)."""
    import torch

    from attnbench.timing.clocks import ClockMonitor, WindowSampler, window_summary
    reader = ClockMonitor(torch.device("cuda:0")).reader()
    if reader is None:
        return fn(), {}
    read, source = reader
    sampler = WindowSampler(read, source=source).start()
    try:
        result = fn()
    finally:
        readings = sampler.stop()
    return result, window_summary(readings, source=source)


def prefill_rows(lib, kk, prefill, caches, sink: bool):
    for s_kv in caches:
        case = lib.TestParam(4096, s_kv, 2048, h_q=128, d_qk=576, have_attn_sink=sink, num_runs=30, seed=0)
        t = lib.generate_testcase(case)
        result, window = _sampled(lambda case=case, t=t: kk.bench_kineto(
            lambda: lib.run_flash_mla_sparse_fwd(case, t, False), num_tests=30))
        seconds = result.get_kernel_time("sparse_attn_fwd")
        counts = lib.count_flop_and_mem_vol(case, t)
        with contextlib.redirect_stdout(io.StringIO()):
            ok = prefill.run_test(lib.TestParam(4096, s_kv, 2048, h_q=128, d_qk=576, have_attn_sink=sink,
                                                num_runs=0, seed=1))
        yield {"case": "prefill", "s_kv": s_kv, "sink": sink, "us": seconds * 1e6,
               "tflops_all_slots": counts.fwd_flop / seconds / 1e12, "their_check": bool(ok), "window": window}


def decode_rows(lib, decoding, batches, varlen: bool):
    for b in batches:
        raw = lib.RawTestParamForDecode(b=b, h_q=128, s_q=2, h_kv=1, s_kv=32768, is_varlen=varlen, topk=2048,
                                        d_qk=576, enable_attn_sink=True, num_runs=30, seed=0)
        with contextlib.redirect_stdout(io.StringIO()):
            result, window = _sampled(lambda raw=raw: decoding.test_flash_mla(raw.to_test_param()))
        yield {"case": "fp8 decode", "batch": b, "varlen": varlen, "us": result.time_usage_per_us,
               "splitkv_us": result.splitkv_time_usage_us, "combine_us": result.combine_time_usage_us,
               "tflops_all_slots": result.achieved_tflops, "gbps": result.achieved_gBps,
               "their_check": bool(result.is_correct), "window": window}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tests", required=True, help="FlashMLA's tests/ folder")
    p.add_argument("--caches", type=int, nargs="*", default=[8192, 32768, 65536, 131072])
    p.add_argument("--batches", type=int, nargs="*", default=[2, 64, 128])
    args = p.parse_args(argv)
    sys.path.insert(0, args.tests)
    import torch
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda:0")
    torch.set_float32_matmul_precision("high")
    import kernelkit as kk
    import lib
    import test_flash_mla_sparse_decoding as decoding
    import test_flash_mla_sparse_prefill as prefill

    ok = True
    parts = (prefill_rows(lib, kk, prefill, args.caches, True), prefill_rows(lib, kk, prefill, args.caches[:1], False),
             decode_rows(lib, decoding, args.batches, True), decode_rows(lib, decoding, args.batches, False))
    for part in parts:
        for row in part:  # printed as each case ends: a call cut short keeps what it measured
            ok &= row["their_check"]
            print(json.dumps(row), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

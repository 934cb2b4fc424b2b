"""FlashMLA's own test scripts timing its sparse kernels, at the shapes of attnbench's DeepSeek-V3.2 presets: the
number to set beside ``attnbench run --preset deepseek-v3.2-sparse-prefill`` / ``-decode`` on the same machine.

    python3 benchmarks/flashmla_own.py --tests PATH/TO/FlashMLA/tests

Imports ``test_flash_mla_sparse_prefill.run_test`` and ``test_flash_mla_sparse_decoding.test_flash_mla`` from
FlashMLA's ``tests/`` (deepseek-ai/FlashMLA @9241ae3, with its ``kernelkit``) and runs them on one shape each (their
own correctness check included): prefill s_q 4096 over 8192 rows, 128 and 64 heads, top-k 2048, d_qk 576, no sink
(all slots valid, as in attnbench's causal case where every query sees at least 4097 rows); FP8 decode b 128, s_q 2,
32768 rows per request, top-k 2048, fixed lengths, no sink. Their times are kernel times from the profiler
(kineto); their prefill TFLOP/s count every slot, which equals attnbench's count when every slot is valid.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tests", required=True, help="FlashMLA's tests/ folder")
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

    rows = []
    for heads in (128, 64):
        case = lib.TestParam(4096, 8192, 2048, h_q=heads, d_qk=576, num_runs=30, seed=0)
        t = lib.generate_testcase(case)
        seconds = kk.bench_kineto(lambda case=case, t=t: lib.run_flash_mla_sparse_fwd(case, t, False),
                                  num_tests=30).get_kernel_time("sparse_attn_fwd")
        flops = lib.count_flop_and_mem_vol(case, t).fwd_flop
        with contextlib.redirect_stdout(io.StringIO()):
            ok = prefill.run_test(lib.TestParam(4096, 8192, 2048, h_q=heads, d_qk=576, num_runs=0, seed=1))
        rows.append({"case": f"sparse prefill h{heads} s_q 4096 s_kv 8192 top-k 2048", "us": seconds * 1e6,
                     "tflops": flops / seconds / 1e12, "their_check": bool(ok)})
        print(json.dumps(rows[-1]), flush=True)
    raw = lib.RawTestParamForDecode(b=128, h_q=128, s_q=2, h_kv=1, s_kv=32768, is_varlen=False, topk=2048,
                                    enable_attn_sink=False, num_runs=30, seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        result = decoding.test_flash_mla(raw.to_test_param())
    rows.append({"case": "sparse fp8 decode b128 s_q 2 h128 s_kv 32768 top-k 2048", "us": result.time_usage_per_us,
                 "tflops": result.achieved_tflops, "gbps": result.achieved_gBps, "their_check": result.is_correct})
    print(json.dumps(rows[-1]), flush=True)
    return 0 if all(r["their_check"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""How much FlashMLA's own benchmark moves between runs: the call it times, timed again by
``triton.testing.do_bench`` (its mean, as the script reports, and its median), with the script's sequential page
table and with a shuffled one (as attnbench allocates). Needs flash_mla and a GPU.

    python3 flashmla_do_bench_spread.py
"""

import functools

import torch
import triton
from flash_mla import flash_mla_with_kvcache, get_mla_metadata


def main() -> None:
    torch.manual_seed(0)
    b, h_q, d, dv = 128, 128, 576, 512
    for n in (1024, 8192, 32768):
        lens = torch.tensor([n + 2 * i for i in range(b)], dtype=torch.int32, device="cuda")
        pad = triton.cdiv(int(lens.max()), 256) * 256
        q = torch.randn(b, 1, h_q, d, device="cuda", dtype=torch.bfloat16)
        table = torch.arange(b * pad // 64, dtype=torch.int32, device="cuda").view(b, pad // 64)
        shuffled = table.flatten()[torch.randperm(table.numel(), device="cuda")].view_as(table).int()
        k = torch.randn(table.numel(), 64, 1, d, device="cuda", dtype=torch.bfloat16)
        meta, splits = get_mla_metadata(lens, h_q, 1)
        for name, pages in (("sequential", table), ("shuffled", shuffled)):
            call = functools.partial(flash_mla_with_kvcache, q, k, pages, lens, dv, meta, splits, causal=True)
            call()
            mean = triton.testing.do_bench(call)
            median = triton.testing.do_bench(call, return_mode="median")
            print(f"L={n:6d} {name:>10} pages: do_bench mean {mean * 1e3:7.1f} us  median {median * 1e3:7.1f} us",
                  flush=True)


if __name__ == "__main__":
    main()

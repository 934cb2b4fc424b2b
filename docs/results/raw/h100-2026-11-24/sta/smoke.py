# The build check of 2026-11-24 (build.sh); it printed the 18x48x80 lines and stopped at 36x48x48, whose
# built windows do not include 3x3x5 (the backends check windows before calling).
import sys
import time

import torch

sys.path.insert(0, sys.argv[1])
import fastvideo_kernel.ops as ops
from fastvideo_kernel.triton_kernels.st_attn_triton import sliding_tile_attention_triton

print("sta_fwd:", ops.sta_fwd)
torch.manual_seed(0)
for shape, n, text in (("18x48x80", 69120, 0), ("36x48x48", 82944, 0), ("30x48x80", 115200 + 226, 226)):
    q, k, v = (torch.randn(1, 2, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    win = [(3, 3, 5), (3, 1, 10)]
    has_text = text > 0
    o_tk = ops.sliding_tile_attention(q, k, v, win, text, has_text, shape)
    try:
        o_tr = sliding_tile_attention_triton(q, k, v, win, text, has_text, shape)
        d = (o_tk.float() - o_tr.float()).abs()
        print(shape, "tk vs triton max", d.max().item(), "mean", d.mean().item())
    except Exception as e:
        print(shape, "triton:", type(e).__name__, str(e)[:200])
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        ops.sliding_tile_attention(q, k, v, win, text, has_text, shape)
    torch.cuda.synchronize()
    print(shape, "tk ms", (time.perf_counter() - t) / 5 * 1e3)

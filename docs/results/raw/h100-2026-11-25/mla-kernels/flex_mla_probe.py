"""Does FlexAttention's compiled CUDA kernel take MLA decode's 576/512 head sizes? One dense case, timed by events."""
import torch
from torch.nn.attention.flex_attention import flex_attention

fn = torch.compile(flex_attention, dynamic=False, fullgraph=True)
for heads in (16, 128):
    b, n = 128, 4096
    q = torch.randn(b, heads, 1, 576, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 1, n, 576, device="cuda", dtype=torch.bfloat16)
    v = k[..., :512]
    try:
        out = fn(q, k, v, scale=192 ** -0.5, enable_gqa=True)
        probs = torch.softmax(torch.einsum("bhqd,bkd->bhqk", q.float(), k[:, 0].float()) * 192 ** -0.5, -1)
        ref = torch.einsum("bhqk,bkd->bhqd", probs, v[:, 0].float())
        err = (out.float() - ref).abs().max().item()
        ts = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(q, k, v, scale=192 ** -0.5, enable_gqa=True)
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        gb = (b * n * 576 * 2) / (ts[10] * 1e-3) / 1e9
        print(f"flex heads {heads}: ok, max err {err:.4f}, median {ts[10] * 1e3:.0f} us, {gb:.0f} GB/s of latent read")
    except Exception as exc:
        print(f"flex heads {heads}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")

"""FlashInfer's sink wrapper against candidate references, queries fewer than keys and not."""
import sys
import time

import torch

from attnbench.backends.flashinfer import FlashInfer
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec


def ref(q, k, v, sinks, scale, align, use_sink):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    k = k.repeat_interleave(g, dim=2).float()
    v = v.repeat_interleave(g, dim=2).float()
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * scale
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    off = (sk - sq) if align == "br" else 0
    s = s.masked_fill(j > i + off, float("-inf"))
    if use_sink:
        col = sinks.float()[None, :, None, None].expand(b, hq, sq, 1)
        p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def rel(a, b):
    return float((a.float() - b).norm() / b.norm())


CONFIGS = [
    ("auto", dict(batch=2, seqlens_q=(300,), seqlens_k=(1000,), heads_q=8, heads_kv=2, head_dim=128)),
    ("auto", dict(batch=2, seqlens_q=(1000,), heads_q=8, heads_kv=2, head_dim=128)),
    ("auto", dict(batch=2, seqlens_q=(300,), seqlens_k=(1000,), heads_q=8, heads_kv=8, head_dim=128)),
    ("auto", dict(batch=2, seqlens_q=(384,), seqlens_k=(1024,), heads_q=8, heads_kv=2, head_dim=128)),
    ("auto", dict(batch=1, seqlens_q=(300,), seqlens_k=(1000,), heads_q=8, heads_kv=2, head_dim=128)),
    ("auto", dict(batch=1, seqlens_q=(77, 300, 1, 1000), heads_q=8, heads_kv=2, head_dim=128)),
    ("auto", dict(batch=2, seqlens_q=(300,), seqlens_k=(1000,), heads_q=8, heads_kv=2, head_dim=64)),
    ("auto", dict(batch=2, seqlens_q=(1000,), heads_q=8, heads_kv=2, head_dim=64)),
    ("fa2", dict(batch=2, seqlens_q=(300,), seqlens_k=(1000,), heads_q=8, heads_kv=2, head_dim=128)),
]
only = sys.argv[1:] and {int(x) for x in sys.argv[1:]}
for n, (template, shape) in enumerate(CONFIGS):
    if only and n not in only:
        continue
    spec = AttnSpec(**shape, dtype="bf16", causal=True, sinks=True, pass_="fwd")
    inputs = make_inputs(spec, "cuda", seed=11)
    t0 = time.time()
    out = FlashInfer(template).prepare(spec, inputs).fn().out
    torch.cuda.synchronize()
    if inputs.varlen:
        print(n, template, shape, f"{time.time() - t0:.0f}s varlen out {tuple(out.shape)}", flush=True)
        from attnbench.accuracy.check import AccuracyChecker
        acc = AccuracyChecker()(spec, inputs, FlashInfer(template).prepare(spec, inputs).fn(), FlashInfer(template))
        print("   verdict", acc["verdict"], acc.get("reason", "")[:200], flush=True)
        continue
    cands = {f"{a}{'+sink' if s else ''}": rel(out, ref(inputs.q, inputs.k, inputs.v, inputs.sinks, spec.softmax_scale,
                                                         a, s))
             for a in ("br", "tl") for s in (True, False)}
    print(n, template, shape, f"{time.time() - t0:.0f}s", " ".join(f"{k}={v:.4f}" for k, v in cands.items()),
          flush=True)

"""References for the distributed check: the exact result and the same kernel on one device.

``exact_attention`` is softmax attention in fp64 on CPU and fp32 with TF32 off on GPUs, computed in
query chunks so that the score matrix never exceeds ``max_bytes`` (a 128k sequence fits), forward
and backward. ``single_device`` runs the local kernel on the full, unsharded inputs: the result the
distributed run must reproduce.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from attnbench.distributed.kernels import LocalKernel, local_attention

TENSORS = ("out", "dq", "dk", "dv")


@contextmanager
def _no_tf32():
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def exact_attention(q, k, v, dout, *, causal: bool, scale: float, max_bytes: int = 2**28) -> dict:
    """Exact out, dq, dk, dv of bshd inputs (fp64 on CPU, fp32 on GPU), chunked over queries."""
    acc = torch.float64 if q.device.type == "cpu" else torch.float32
    groups = q.shape[2] // k.shape[2]
    qh, doh = q.transpose(1, 2).to(acc), dout.transpose(1, 2).to(acc)
    kh = k.transpose(1, 2).to(acc).repeat_interleave(groups, dim=1)
    vh = v.transpose(1, 2).to(acc).repeat_interleave(groups, dim=1)
    b, h, s, _ = qh.shape
    sk = kh.shape[2]
    rows = max(1, max_bytes // (b * h * sk * torch.finfo(acc).bits // 8))
    with _no_tf32():
        out, lse = torch.empty_like(doh[..., : vh.shape[-1]]), qh.new_empty(b, h, s)
        for a in range(0, s, rows):
            p_log = _scores(qh, kh, a, min(s, a + rows), causal, scale)
            lse[:, :, a:a + rows] = torch.logsumexp(p_log, dim=-1)
            out[:, :, a:a + rows] = torch.matmul(torch.exp(p_log - lse[:, :, a:a + rows, None]), vh)
        delta = (doh * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.empty_like(qh), torch.zeros_like(kh), torch.zeros_like(vh)
        for a in range(0, s, rows):
            e = min(s, a + rows)
            p = torch.exp(_scores(qh, kh, a, e, causal, scale) - lse[:, :, a:e, None])
            dv += torch.matmul(p.transpose(-2, -1), doh[:, :, a:e])
            ds = p * (torch.matmul(doh[:, :, a:e], vh.transpose(-2, -1)) - delta[:, :, a:e])
            dq[:, :, a:e] = torch.matmul(ds, kh) * scale
            dk += torch.matmul(ds.transpose(-2, -1), qh[:, :, a:e]) * scale
    dk = dk.view(b, h // groups, groups, sk, -1).sum(2)
    dv = dv.view(b, h // groups, groups, sk, -1).sum(2)
    return {name: t.transpose(1, 2) for name, t in zip(TENSORS, (out, dq, dk, dv), strict=True)}


def _scores(qh, kh, a: int, e: int, causal: bool, scale: float):
    s = torch.matmul(qh[:, :, a:e], kh.transpose(-2, -1)) * scale
    if causal:  # query a+i sees keys 0..a+i (equal lengths)
        rows = torch.arange(a, e, device=s.device)[:, None]
        cols = torch.arange(kh.shape[2], device=s.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


def single_device(q, k, v, dout, *, kernel: LocalKernel, causal: bool, scale: float) -> dict:
    """out, dq, dk, dv of the local kernel on the full inputs (the non-distributed result)."""
    ql, kl, vl = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = local_attention(ql, kl, vl, kernel, causal, scale)
    dq, dk, dv = torch.autograd.grad(out, (ql, kl, vl), dout)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def max_mean(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Max and mean absolute difference, computed in fp64."""
    d = (a.double() - b.double()).abs()
    return float(d.max()), float(d.mean())

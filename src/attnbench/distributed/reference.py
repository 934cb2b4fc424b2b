"""References for the distributed check: the exact result and the same kernel on one device.

``exact_attention`` is the blocked exact reference of ``attnbench.accuracy`` (no S x S matrix, so
a 128k sequence fits), forward and backward. ``single_device`` runs the local kernel on the full, unsharded inputs: the result the
distributed run must reproduce.
"""

from __future__ import annotations

import torch

from attnbench.accuracy.reference import attention_backward, attention_forward
from attnbench.distributed.kernels import LocalKernel, local_attention

TENSORS = ("out", "dq", "dk", "dv")


def exact_attention(q, k, v, dout, *, causal: bool, scale: float) -> dict:
    """Exact out, dq, dk, dv of bshd inputs: the blocked reference of ``attnbench.accuracy``
    (fp64 on CPU and for fp32 inputs, fp32 with TF32 off for 16-bit inputs on GPUs)."""
    out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
    grads = attention_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)  # by name: dq, dk, dv
    return {"out": out, **{name: grads[name] for name in TENSORS[1:]}}


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

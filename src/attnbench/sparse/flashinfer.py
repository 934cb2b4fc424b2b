"""FlashInfer 0.7.2.post1's DSA sparse attention for an index-selected MLA case, returning ``Outputs`` in the
layout of ``reference.py``: out (T, Hq, 512), lse (Hq, T), and with ``fwd_bwd`` dq (T, Hq, 576), dkv (N, 576).
Written against the package's source; not yet run on a GPU here. ``flashinfer`` is imported inside the function.

``flashinfer.dsa_sparse_attention.dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices,
topk_length=, softmax_scale=, return_lse=True) -> (out, lse)`` (``dsa_sparse_attention.py:41-55``):
q_latent (T, 64, 512) and q_rope (T, 64, 64) bf16, views of a packed (T, 64, 576) query accepted (``:73-80``);
kv_latent (S, 512) and k_rope (S, 64), columns 0:512 and 512:576 of the packed rows accepted (``:81-87``);
indices int32 (T, topk) of global rows, "-1 or a value >= S marks an invalid slot ... anywhere in the row"
(``:88-91``), so every negative slot of the case is rewritten as -1; topk_length int32 (T,) (``:92-94``). out
(T, 64, 512) bf16, lse (T, 64) fp32 natural log, -inf and out 0 for a row with no valid slot (``:96-99,131-134``;
the reference's convention). No sink argument. Differentiable: gradients flow to the four operands
(``:136-138``), here views of one q and one kv leaf, so autograd sums them into dq and dkv. Only 64 query heads
(``experimental/cake_dsa_train/cake_backend.py:66``) and compute capability 10.0, 10.3 or 10.7
(``cake_backend.py:73-75,471``; "SM100 / SM103 / SM107 only", ``dsa_sparse_attention.py:57``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.outputs import Outputs
from attnbench.sparse.reference import LATENT, ROPE
from attnbench.sparse.spec import SparseInputs, SparseSpec

HEADS = 64
CAPABILITIES = ((10, 0), (10, 3), (10, 7))
KERNEL = "flashinfer.dsa_sparse_attention.dsa_sparse_attention"


def case_reason(spec: SparseSpec) -> str | None:
    """Why the kernel cannot take ``spec`` whatever the GPU, or None."""
    if spec.decode:
        return "flashinfer's dsa_sparse_attention reads a bf16 cache, not FP8 rows"
    if spec.heads != HEADS:
        return f"flashinfer's dsa_sparse_attention takes {HEADS} query heads, not {spec.heads}"
    if spec.d_qk != LATENT + ROPE or spec.d_v != LATENT:
        return f"flashinfer's dsa_sparse_attention takes rows of {LATENT + ROPE} with d_v {LATENT}, not " \
               f"{spec.d_qk}/{spec.d_v}"
    if spec.dtype != "bf16":
        return f"flashinfer's dsa_sparse_attention takes bf16, not {spec.dtype}"
    if spec.sink:
        return "flashinfer's dsa_sparse_attention has no attention sink"
    if spec.extra is not None:
        return "flashinfer's dsa_sparse_attention takes one cache, no extra cache"
    return None


def arch_reason(capability: tuple[int, int]) -> str | None:
    """Why a GPU of compute ``capability`` has no kernel, or None."""
    if tuple(capability) in CAPABILITIES:
        return None
    return f"flashinfer's dsa_sparse_attention runs on sm100/sm103/sm107 only, not sm{capability[0]}{capability[1]}"



def prepare(spec: SparseSpec, inputs: SparseInputs) -> Callable[[], Outputs]:
    """A closure calling the kernel on ``inputs`` (module doc); checks the case only, not the GPU."""
    if (why := case_reason(spec)) is not None:
        raise ValueError(why)
    from flashinfer.dsa_sparse_attention import dsa_sparse_attention

    sel = inputs.selection
    idx = torch.where(sel.indices < 0, -1, sel.indices).to(torch.int32).contiguous()
    lengths = None if sel.lengths is None else sel.lengths.to(torch.int32).contiguous()
    q0, kv0 = inputs.q.contiguous(), inputs.kv.contiguous()
    grads = spec.pass_ == "fwd_bwd"

    def call() -> Outputs:
        q, kv = (x.detach().requires_grad_(grads) for x in (q0, kv0))
        with torch.set_grad_enabled(grads):
            out, lse = dsa_sparse_attention(q[..., :LATENT], q[..., LATENT:], kv[:, :LATENT], kv[:, LATENT:], idx,
                                            topk_length=lengths, softmax_scale=spec.scale, return_lse=True)
        result = Outputs(out=out.detach(), lse=lse.detach().T)
        if grads:
            result["dq"], result["dkv"] = torch.autograd.grad(out, (q, kv), inputs.dout)
        return result
    return call

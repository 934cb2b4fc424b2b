"""FlashQLA 0.1.3's Gated DeltaNet prefill (``flash_qla.chunk_gated_delta_rule``) for a recurrence case, forward and
backward, returning ``Outputs`` in the reference's layout. Written against the package's source (read in
docs/linear.md, "FlashQLA 0.1.3"); run on an H200 (docs/results/2026-11-28-h200-recurrences.md). ``flash_qla``
is imported inside the functions: importing it needs a GPU (it picks its kernels' architecture then) and tilelang.

``chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
cu_seqlens, auto_cp=...)`` takes fla's layouts and names: q, k (B, T, H, 128), v (B, T, HV, 128) in fp16 or bf16,
g the log-decay and beta (B, T, HV) — g in fp32, which its backward asserts —, the state (N, HV, K, V) (fp32 out),
``cu_seqlens`` with B = 1; value head hv reads q/k head hv // (HV / H), as the reference. It is differentiable (an
autograd Function over its own forward and backward kernels): gradients for q, k, v, g, beta and the initial state.
Chunks are 64 tokens on sm90/sm100/sm103, 32 on sm120/sm121, fixed. An ungated case (DeltaNet) is handed g = 0.

``auto_cp`` (FlashQLA's default True): with B = 1 each call may split long sequences into pieces run side by side
on the one GPU, from a cost model; attnbench passes it as the backend option ``flashqla.auto_cp`` (default True,
FlashQLA's own) and records it, so a time at B = 1 says whether the split was allowed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.linear.inputs import RecurrenceInputs, kernel_closure
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs

HEAD_DIM = 128
"""FlashQLA's one head size (K = V = 128, asserted in every kernel wrapper)."""
CHUNKS = {9: 64, 10: 64, 12: 32}
"""Tokens per chunk by compute-capability major: the architectures FlashQLA 0.1.3 has kernels for."""


def case_reason(spec: RecurrenceSpec) -> str | None:
    """Why FlashQLA cannot take ``spec`` whatever the GPU (kind, decode, sizes, dtype), or None."""
    if spec.kind != "gdn":
        return f"FlashQLA runs gdn, not {spec.kind}"
    if spec.decode:
        return "FlashQLA 0.1.3 has the chunked prefill only: no decode kernel"
    if spec.d_k != HEAD_DIM or spec.d_v != HEAD_DIM:
        return f"FlashQLA takes d_k = d_v = {HEAD_DIM}, not {spec.d_k}/{spec.d_v}"
    if spec.dtype not in ("fp16", "bf16"):
        return f"FlashQLA takes fp16 or bf16, not {spec.dtype}"
    return None


def arch_reason(spec: RecurrenceSpec, capability: tuple[int, int]) -> str | None:
    """Why the GPU of compute ``capability`` cannot run ``spec`` with FlashQLA (its architectures, its chunk there)."""
    major, minor = capability
    if major not in CHUNKS:
        return f"FlashQLA has kernels for sm90, sm100/sm103 and sm120/sm121, not sm{major}{minor}"
    if spec.chunk != CHUNKS[major]:
        return f"FlashQLA runs chunks of {CHUNKS[major]} tokens on sm{major}{minor}, not {spec.chunk} (--chunk)"
    if major == 12 and (spec.pass_ == "fwd_bwd" or spec.dtype != "bf16"):
        return "fla-core dispatches FlashQLA on sm120 for the bf16 forward only; its backward there is untried"
    return None



def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, auto_cp: bool = True) -> Callable[[], Outputs]:
    """A closure calling FlashQLA on ``inputs`` (forward, and with ``fwd_bwd`` the gradients of every input by
    autograd). Checks the case only (``case_reason``), not the GPU."""
    return kernel_closure(spec, inputs, case_reason(spec), lambda: kernel(spec, auto_cp))


def kernel(spec: RecurrenceSpec, auto_cp: bool = True):
    """(inputs by name, cu_seqlens) -> (out, final_state) through FlashQLA, differentiable (``prepare``, and a
    model's layer through ``backends.FlashQla.functional``). An ungated case is handed g = 0."""
    from flash_qla import chunk_gated_delta_rule as fn

    def call(t: dict, cu_seqlens=None):
        g = t["g"] if "g" in t else t["beta"].new_zeros(t["beta"].shape, dtype=torch.float32)
        return fn(t["q"], t["k"], t["v"], g, t["beta"], scale=spec.qk_scale, initial_state=t.get("initial_state"),
                  output_final_state=True, use_qk_l2norm_in_kernel=spec.l2norm, cu_seqlens=cu_seqlens,
                  auto_cp=auto_cp)
    return call

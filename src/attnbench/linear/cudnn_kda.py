"""cuDNN frontend 1.32's Kimi Delta Attention (``cudnn.linear_attention.kimi_delta_attention``) for a KDA case,
forward and backward, returning ``Outputs`` in the reference's layout. Written against the wheel's source
(docs/linear.md, "cuDNN frontend 1.32"); run on an H200 (docs/results/2026-11-28-h200-recurrences.md). ``cudnn`` is
imported inside the functions: this module loads without it. Line numbers are those of the 1.32.0 wheel.

``kimi_delta_attention(q, k, v, g, beta, cu_seqlens, scale, initial_state, output_final_state,
use_qk_l2norm_in_kernel, ..., gate_domain="log", ..., plan_name=None)`` (``linear_attention/ops/kda.py:1239``)
takes packed tokens (THD): q, k (T, H, K), v (T, HV, V), g the per-channel log-decay (T, HV, K), beta the strength
after its sigmoid (T, HV), ``cu_seqlens`` (N+1,) always (a dense batch is B sequences of T packed tokens), the
states (N, HV, V, K), V-major: the transpose of the reference's (N, HV, K, V). It returns ``(o, final_state)``, o
shaped like v, and is differentiable (``torch.library.register_autograd``, ``kda.py:1227``).

Which engine serves a call is cuDNN's choice among those that accept it (``kda_heuristics.py``: on sm90
``kda_hopper_cuda`` first, then ``kda_hopper``; ``plan_name`` pins one). On Hopper (``hopper/cuda_engine.py``,
``kda_engine.py``), what attnbench hands them:

- forward: bf16 q, k, v; K = V = 128; q and k heads equal, value heads a multiple of them (the forward runs its
  grid over value heads and maps value head hv to q/k head hv // (HV / H), as the reference does); g and beta in
  fp32; the states fp32; the L2 norm of q and k in the kernel or not; any scale (``kda_hopper`` takes the
  default 1/sqrt(128) only and then declines, leaving the call to the other engine);
- backward (``kda_hopper_cuda`` only): equal head counts, q and k already L2-normalised (no in-kernel norm), the
  default scale, fp32 gates; anything else has no sm90 engine, refused here before it runs.

``kda_hopper_cuda`` compiles CUDA C++ with NVRTC at its first call and needs the CUDA include tree
(``cuda_engine.py:366-368``); ``kda_hopper`` is CuTe DSL (``nvidia-cutlass-dsl``). The package also needs cuDNN 9's
library at import. Its GDN and Mamba2 engines are Blackwell-only (``frost/engine.py:23-24``); its Blackwell KDA
engines were not read, so attnbench takes this backend on sm90 only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.linear.inputs import RecurrenceInputs, kernel_closure
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs

HEAD_DIM = 128
"""The Hopper engines' one head size (``cuda_engine.py``: "head dims must be 128")."""
PLANS = ("auto", "kda_hopper_cuda", "kda_hopper")
"""The ``plan`` option: cuDNN's own order (auto), or one Hopper engine pinned by its ``plan_name``."""


def case_reason(spec: RecurrenceSpec) -> str | None:
    """Why cuDNN's Hopper KDA engines cannot take ``spec`` whatever the GPU (kind, decode, sizes, dtype, and the
    backward's narrower scope), or None."""
    if spec.kind != "kda":
        extra = " (its gdn and mamba2 engines are Blackwell-only)" if spec.kind in ("gdn", "mamba2") else ""
        return f"cuDNN's KDA backend runs kda, not {spec.kind}{extra}"
    if spec.decode:
        return "cuDNN frontend 1.32 has no one-token KDA kernel: prefill only"
    if spec.d_k != HEAD_DIM or spec.d_v != HEAD_DIM:
        return f"cuDNN's Hopper KDA takes d_k = d_v = {HEAD_DIM}, not {spec.d_k}/{spec.d_v}"
    if spec.dtype != "bf16":
        return f"cuDNN's Hopper KDA takes bf16 q, k, v, not {spec.dtype}"
    if spec.pass_ == "fwd_bwd":
        if spec.heads_v != spec.heads_qk:
            return (f"cuDNN's Hopper KDA backward needs as many value heads as q/k heads, not "
                    f"{spec.heads_qk}/{spec.heads_v}")
        if spec.l2norm:
            return "cuDNN's Hopper KDA backward takes q and k already L2-normalised: a case without in-kernel l2norm"
        if abs(spec.qk_scale - HEAD_DIM ** -0.5) > 1e-9:
            return f"cuDNN's Hopper KDA backward bakes in the scale 1/sqrt({HEAD_DIM}), not {spec.qk_scale:g}"
    return None


def arch_reason(capability: tuple[int, int]) -> str | None:
    """Why the GPU of compute ``capability`` is not one this backend takes (module doc: sm90 only)."""
    major, minor = capability
    if (major, minor) != (9, 0):
        return f"attnbench takes cuDNN's KDA on sm90 (its Hopper engines) only, not sm{major}{minor}"
    return None


def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, plan: str = "auto") -> Callable[[], Outputs]:
    """A closure calling cuDNN's KDA on ``inputs`` (forward, and with ``fwd_bwd`` the gradients of every input by
    autograd). Checks the case only (``case_reason``), not the GPU."""
    return kernel_closure(spec, inputs, case_reason(spec), lambda: kernel(spec, plan))


def offsets(spec: RecurrenceSpec, tokens: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """int32 (N+1,) sequence offsets over the packed tokens: the case's own for varlen, [0, T, 2T, ...] dense."""
    if cu_seqlens is not None:
        return cu_seqlens.to(device=device, dtype=torch.int32)
    t = tokens // spec.num_seqs
    return torch.arange(0, tokens + 1, t, dtype=torch.int32, device=device)


def kernel(spec: RecurrenceSpec, plan: str = "auto"):
    """(inputs by name in the reference's layout, cu_seqlens) -> (out, final_state) through cuDNN's KDA,
    differentiable; the layouts are converted inside (module doc)."""
    if plan not in PLANS:
        raise ValueError(f"plan must be one of {', '.join(PLANS)}, not {plan!r}")
    from cudnn.linear_attention import kimi_delta_attention as fn

    def call(t: dict, cu_seqlens=None):
        q, k, v, g, beta, h0 = t["q"], t["k"], t["v"], t["g"], t["beta"], t.get("initial_state")
        packed = q.shape[0] * q.shape[1]
        o, state = fn(q.reshape(packed, *q.shape[2:]), k.reshape(packed, *k.shape[2:]),
                      v.reshape(packed, *v.shape[2:]), g.float().reshape(packed, *g.shape[2:]),
                      beta.float().reshape(packed, beta.shape[2]), offsets(spec, packed, cu_seqlens, q.device),
                      scale=spec.qk_scale,
                      initial_state=None if h0 is None else h0.float().transpose(-1, -2).contiguous(),
                      output_final_state=True, use_qk_l2norm_in_kernel=spec.l2norm,
                      plan_name=None if plan == "auto" else plan)
        return o.reshape(v.shape), state.transpose(-1, -2)
    return call

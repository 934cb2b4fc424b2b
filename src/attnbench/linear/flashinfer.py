"""FlashInfer 0.7.2.post1's Gated DeltaNet kernels for a recurrence case, returning ``Outputs`` in the reference's
layout: ``out`` in v's input layout, ``final_state`` (N, HV, K, V). Written against the package's source; not yet
run on a GPU here. ``flashinfer`` is imported inside the functions: this module loads without it.

- ``prefill``: ``flashinfer.gdn_prefill.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
  output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)`` (``gdn_prefill.py:617-638``). q, k (total, H, D), v
  (total, HV, D): one head size D for K and V (the state is (D, D), ``:667-668``); ``cu_seqlens`` is always required
  (``:826``), so a dense case is handed as B sequences of T packed tokens. ``g`` is the decay itself, not its log:
  "Forget gate (alpha) ... Defaults to all ones" (``:657-659``), and the SM90 kernel takes ``log2(alpha + 1e-10)``
  of it (``gdn_kernels/delta_rule_dsl/alpha.py:37``): the case's log-decay is handed as ``exp(g)``, and an ungated
  case (DeltaNet) as ``g=None``. g and beta are fp32 (``:658-662``). The state, initial and final, is stored
  transposed: "The final state layout is ``[N, H, V, K]``" (``:783``), the same pool layout as the initial state
  (``:1005``); the initial state is handed as ``initial_state.transpose(-1, -2)`` and the final state comes back
  through the same transpose. The in-kernel L2 norm uses eps 1e-6 (``:683``), the reference's. Kernels:
  SM90, SM100/SM103 and SM120 (``:1161-1273``; any other arch raises NotImplementedError, ``:1273``); D must be
  128 on each (SM100 ``:1170``, SM90 ``delta_rule_sm90.py:2415-2416``, SM120 ``delta_rule_sm120.py:2071-2072``);
  SM90 and SM120 take fp16/bf16 only (``delta_rule_sm90.py:2422-2428``, ``delta_rule_sm120.py:2084``); SM100 needs
  CUDA 13 (``:1162-1165``). Chunks are 64 tokens (``BLK_Q = BLK_KV = 64``, ``delta_rule_sm90.py:159-160``; "the
  chunk size (64)", ``gdn_prefill.py:720``). Forward only: the function is a plain call, no autograd Function.
- ``decode``: ``flashinfer.gdn_decode.gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale,
  use_qk_l2norm=)`` (``gdn_decode.py:1151-1164``), q, k (B, 1, H, K), v (B, 1, HV, V), the state (B, HV, K, V)
  fp32, "K-major ... no transpose needed" (``:1169,1219``) — the reference's layout — and updated in place
  (``:1181``), so each call first copies the case's initial state into the kernel's buffer (a copy of the state,
  timed with the call). The kernel computes its gates itself: ``g = -exp(A_log)·softplus(a + dt_bias)`` (softplus
  with threshold 20), decay ``exp(g)``, ``beta = sigmoid(b)`` (``gdn_kernels/gdn_decode_nontranspose.py:144-158,
  846-847``). The case's g and beta are handed as ``A_log = dt_bias = 0``, ``a = softplus⁻¹(−g)`` and
  ``b = logit(beta)``, a and b in the case's dtype as documented (``gdn_decode.py:1185-1191``): their rounding is
  an error the reference does not have. g must be < 0 (an ungated case cannot be expressed). K, V ≥ 128, V a
  multiple of 32, q fp16/bf16 (``:1214-1216,1232-1243``); the output is allocated in bf16 ("Kernel outputs bfloat16",
  ``:1260-1261``), so only bf16 cases are taken. SM90 only ("Requires SM90 (Hopper) architecture", ``:1212``).
  Value head hv reads q/k head ``hv // (HV // H)`` (``gdn_decode_nontranspose.py:96``), as the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.linear.inputs import RecurrenceInputs, validate
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs

OPS = ("prefill", "decode")
HEAD_DIM = 128
"""The one head size of FlashInfer's GDN prefill kernels (SM90/SM100/SM120)."""
CHUNK = 64
"""Tokens per chunk of the prefill kernels."""
PREFILL_ARCHS = (9, 10, 12)
"""Compute-capability majors with a prefill kernel (``gdn_prefill.py:1161-1273``)."""
DECODE_MIN_DIM, DECODE_V_TILE = 128, 32
"""Decode asserts K, V >= 128 and V % 32 == 0 (``gdn_decode.py:1232-1240``)."""
SOFTPLUS_THRESHOLD = 20.0
"""The decode kernel's softplus is x itself above 20 (``gdn_decode_nontranspose.py:147,155,847``)."""


def case_reason(spec: RecurrenceSpec, op: str) -> str | None:
    """Why FlashInfer's GDN ``op`` cannot take ``spec`` whatever the GPU (kind, pass, sizes, dtype), or None."""
    if op not in OPS:
        raise ValueError(f"unknown flashinfer gdn op {op!r}; allowed: {', '.join(OPS)}")
    if spec.kind != "gdn":
        return f"flashinfer's GDN kernels run gdn, not {spec.kind}"
    if spec.pass_ != "fwd":
        return "flashinfer's GDN kernels have no backward: fwd only"
    if op == "prefill":
        if spec.decode:
            return "a prefill kernel: decode cases go to flashinfer-gdn-decode"
        if spec.d_k != HEAD_DIM or spec.d_v != HEAD_DIM:
            return f"flashinfer's GDN prefill takes d_k = d_v = {HEAD_DIM}, not {spec.d_k}/{spec.d_v}"
        if spec.dtype not in ("fp16", "bf16"):
            return f"flashinfer's GDN prefill takes fp16 or bf16, not {spec.dtype}"
        if spec.chunk != CHUNK:
            return f"flashinfer's GDN prefill runs chunks of {CHUNK} tokens, not {spec.chunk}"
        return None
    if not spec.decode:
        return "a decode kernel: one new token per sequence (--decode)"
    if not spec.gated:
        return "flashinfer's GDN decode always decays (g = -exp(A_log)·softplus(a + dt_bias)): no ungated case"
    if spec.d_k < DECODE_MIN_DIM or spec.d_v < DECODE_MIN_DIM or spec.d_v % DECODE_V_TILE:
        return (f"flashinfer's GDN decode takes d_k, d_v >= {DECODE_MIN_DIM}, d_v a multiple of {DECODE_V_TILE}, "
                f"not {spec.d_k}/{spec.d_v}")
    if spec.dtype != "bf16":
        return f"flashinfer's GDN decode writes its output in bf16: bf16 cases only, not {spec.dtype}"
    return None


def arch_reason(op: str, capability: tuple[int, int], cuda: str | None) -> str | None:
    """Why the GPU of compute ``capability`` (with CUDA ``cuda``, torch.version.cuda) has no kernel for ``op``."""
    major, minor = capability
    if op == "decode":
        return None if major == 9 else f"flashinfer's GDN decode requires sm90 (Hopper), not sm{major}{minor}"
    if major not in PREFILL_ARCHS:
        return f"flashinfer's GDN prefill has kernels for sm90, sm100/sm103 and sm120, not sm{major}{minor}"
    if major == 10 and int((cuda or "0").split(".")[0]) < 13:
        return f"flashinfer's GDN prefill on sm{major}{minor} needs CUDA 13, not {cuda}"
    return None



def kernel_name(op: str) -> str:
    """The FlashInfer function a case calls (``kernel``)."""
    return ("flashinfer.gdn_prefill.chunk_gated_delta_rule" if op == "prefill"
            else "flashinfer.gdn_decode.gated_delta_rule_decode")


def _offsets(spec: RecurrenceSpec, inputs: RecurrenceInputs, device) -> torch.Tensor:
    """int64 (N+1,) sequence offsets of the packed tokens: the case's own for varlen, B·[0, T, 2T, ...] dense."""
    if inputs.cu_seqlens is not None:
        return inputs.cu_seqlens.to(device=device, dtype=torch.int64)
    t = spec.seqlens[0]
    return torch.arange(0, spec.num_seqs * t + 1, t, dtype=torch.int64, device=device)


def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, op: str = "prefill") -> Callable[[], Outputs]:
    """A closure calling FlashInfer's GDN ``op`` on ``inputs``; the layouts are converted here, once, and the
    closure's results are converted back (module doc). Checks the case only (``case_reason``), not the GPU."""
    validate(spec, inputs)
    if (why := case_reason(spec, op)) is not None:
        raise ValueError(why)
    return (_prefill if op == "prefill" else _decode)(spec, inputs)


def _prefill(spec: RecurrenceSpec, inputs: RecurrenceInputs) -> Callable[[], Outputs]:
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    v_shape = inputs.v.shape
    q, k, v = (x.reshape(-1, *x.shape[-2:]).contiguous() for x in (inputs.q, inputs.k, inputs.v))
    heads_v = spec.heads_v
    g = None if inputs.g is None else torch.exp(inputs.g.float()).reshape(-1, heads_v).contiguous()
    beta = inputs.beta.float().reshape(-1, heads_v).contiguous()
    h0 = None if inputs.initial_state is None else inputs.initial_state.float().transpose(-1, -2).contiguous()
    cu = _offsets(spec, inputs, q.device)

    def call() -> Outputs:
        out, state = chunk_gated_delta_rule(q, k, v, g, beta, spec.qk_scale, initial_state=h0,
                                            output_final_state=True, cu_seqlens=cu,
                                            use_qk_l2norm_in_kernel=spec.l2norm)
        return Outputs(out=out.view(v_shape), final_state=state.transpose(-1, -2))
    return call


def decode_gates(g: torch.Tensor, beta: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) in ``dtype`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (A_log = dt_bias = 0): softplus⁻¹(y)
    = y + log(1 − exp(−y)), and y itself above the kernel's threshold."""
    y = -g.double()
    a = torch.where(y > SOFTPLUS_THRESHOLD, y, y + torch.log(-torch.expm1(-y)))
    b = beta.double()
    return a.to(dtype), (torch.log(b) - torch.log1p(-b)).to(dtype)


def _decode(spec: RecurrenceSpec, inputs: RecurrenceInputs) -> Callable[[], Outputs]:
    from flashinfer.gdn_decode import gated_delta_rule_decode

    n, hv = spec.num_seqs, spec.heads_v
    v_shape = inputs.v.shape
    q, k, v = (x.reshape(n, 1, *x.shape[-2:]).contiguous() for x in (inputs.q, inputs.k, inputs.v))
    a, b = decode_gates(inputs.g.reshape(n, 1, hv), inputs.beta.reshape(n, 1, hv), q.dtype)
    zeros = torch.zeros(hv, dtype=torch.float32, device=q.device)
    h0 = inputs.initial_state.float().contiguous()
    state = torch.empty_like(h0)

    def call() -> Outputs:
        state.copy_(h0)  # updated in place by the kernel
        out, final = gated_delta_rule_decode(q, k, v, state, zeros, a, zeros, b, scale=spec.qk_scale,
                                             use_qk_l2norm=spec.l2norm)
        return Outputs(out=out.view(v_shape), final_state=final.clone())
    return call

"""The exact recurrence, forward and backward, in fp64: the reference every recurrence kernel is compared with.

Per sequence and value head ``hv`` (q/k head ``hv // (HV // H)``) with state ``S`` (K, V), at each token t:

    S   ← exp(g_t) · S                          decay first (per channel for kda: exp(g_t)[:, None] · S)
    u_t = beta_t · (v_t − Sᵀ k_t)              delta rule (gdn, kda), read from the decayed state;
    u_t = v_t                                    otherwise (linear; mamba2 with v_t = dt_t · x_t)
    S   ← S + k_t u_tᵀ
    o_t = scale · Sᵀ q_t                         read after the update, so o_t sees token t itself

and the state after the last token is the final state. With ``spec.l2norm`` q and k are first divided by
``sqrt(Σ x² + 1e-6)`` over each head's d_k (fla's ``l2norm_fwd`` eps). Mamba2 (SSD) is the linear form with
C, B, ``dt·x`` as q, k, v, ``g = A·dt``, scale 1, and ``+ D·x`` on the output with ``skip``.

Confirmed against fla-core 0.6.0 (``fla/ops``): ``gated_delta_rule/naive.py:48-59`` (decay, then
``v − Σ_k h·k``, times beta, rank-one update, then ``o = q·h`` with q pre-scaled), the Triton recurrence
``gated_delta_rule/fused_recurrent.py:114-162`` (same order; ``i_h = i_hv // (HV // H)`` at line 70; the in-kernel
L2 norm ``x / sqrt(Σx² + 1e-6)`` at 118-120), ``kda/naive.py:59-63`` and ``kda/fused_recurrent.py:151-200``
(per-channel ``exp(g)`` on the state's K rows, then the same delta rule), ``simple_gla/chunk.py:238-291`` (the
linear form, g per head), ``modules/norm/l2norm.py:112`` (eps 1e-6); Mamba2 against state-spaces/mamba
``mamba_ssm/modules/ssd_minimal.py:34-78`` (``ssd_minimal_discrete(X·dt, A·dt, B, C)``: decay ``exp(Σ A·dt)``,
no scale) and fla's GitHub ``fla/layers/mamba2.py:521-560`` (commit bc3b101; the wheel has no layers) (decode: ``state·exp(dt·A) + dt·B·x``, ``y = C·state + D·x``).
Mamba's own state is (N, HV, V, K) — headdim before dstate — the transpose of fla's (N, HV, K, V) used here.

Computation: vectorised over sequences and value heads, a loop over tokens. Varlen sequences are padded to
the longest with zero tokens (``inputs.pad_sequences``: a zero token leaves the state as it is), so every
sequence keeps its own state. The backward is autograd through the fp64 loop, with the loop checkpointed in
blocks of ``block`` tokens: memory is one state per block boundary plus one block's steps, about
``(T/block + 2·block)`` states of N·HV·K·V fp64 values (block = sqrt(T) by default).

Returned (``attnbench.outputs.Outputs``): ``out`` (the input layout of v, fp64), ``final_state`` (N, HV, K, V),
and with ``pass_ = fwd_bwd`` a gradient ``d<name>`` for each of ``spec.input_names`` (dq, dk, dv, dg, dbeta,
dinitial_state; mamba2: ddt, dA, dD) of the loss ``<out, dout> + <final_state, dfinal_state>``, each shaped like
its input.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from attnbench.linear.inputs import RecurrenceInputs, pad_sequences, unpad_sequences, validate, with_gradients
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs

L2NORM_EPS = 1e-6
"""Added to Σx² before the square root of the q/k L2 norm (fla's ``l2norm_fwd`` and in-kernel norm)."""


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(Σ x² + 1e-6) over the last dim (fla's definition), computed in fp32 at least and returned in x's dtype
    (as fla's ``l2norm_fwd`` does: a sum of 128 squares in bf16 is off by a few round-offs, the same way for every
    key)."""
    acc = x.to(torch.promote_types(x.dtype, torch.float32))
    return (acc / torch.sqrt((acc * acc).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def expand_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., H, D) q/k -> (..., H·group, D): value head hv reads q/k head hv // group."""
    return x.repeat_interleave(group, dim=-2) if group > 1 else x


def operands(spec: RecurrenceSpec, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """The inputs by name (in the input layout) -> what the recurrence reads, one row per sequence:
    q, k (N, T, HV, K) normalised, expanded to value heads; v (N, T, HV, V) (mamba2: dt·x); g (N, T, HV) or
    (N, T, HV, K) or None; beta (N, T, HV) or None; h0 (N, HV, K, V) or None."""
    q, k = t["q"], t["k"]
    if spec.l2norm:
        q, k = l2norm(q), l2norm(k)
    q, k = expand_heads(q, spec.group), expand_heads(k, spec.group)
    v, g = t["v"], t.get("g")
    if spec.kind == "mamba2":
        g = t["A"] * t["dt"]
        v = v * t["dt"][..., None]
    pad = lambda x: None if x is None else pad_sequences(spec, x)  # noqa: E731
    return dict(q=pad(q), k=pad(k), v=pad(v), g=pad(g), beta=pad(t.get("beta")), h0=t.get("initial_state"))


def finish(spec: RecurrenceSpec, o: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The recurrence's (N, T, HV, V) output -> the layer's output in the input layout (mamba2: + D·x)."""
    o = unpad_sequences(spec, o)
    if spec.skip:
        o = o + t["D"][:, None] * t["v"]
    return o


def recurrence_steps(spec: RecurrenceSpec, s: torch.Tensor, q, k, v, g, beta, *, rounded=None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run tokens 0..T-1 of (N, T, HV, ·) operands from state ``s`` (N, HV, K, V); returns (o (N, T, HV, V), state).
    In whatever dtype the operands come in; the module doc writes the step out. ``rounded(x)``, where given, is
    applied to what a kernel hands to a matmul in its inputs' dtype: the state as q and k read it, and u_t."""
    rnd = rounded or (lambda x: x)
    outs = []
    scale = spec.qk_scale
    steps = q.shape[1]
    per_token = [x.unbind(1) if x is not None else [None] * steps for x in (q, k, v, g, beta)]
    for q_t, k_t, v_t, g_t, beta_t in zip(*per_token):
        if g_t is not None:
            decay = torch.exp(g_t)
            s = s * (decay[..., None] if spec.per_channel else decay[..., None, None])
        u = v_t
        if spec.delta:
            u = beta_t[..., None] * (u - (rnd(s) * k_t[..., None]).sum(-2))
        s = s + k_t[..., None] * rnd(u)[..., None, :]
        outs.append(scale * (rnd(s) * q_t[..., None]).sum(-2))
    return torch.stack(outs, dim=1), s


def run_recurrence(spec: RecurrenceSpec, ops: dict, *, block: int | None = None, checkpointed: bool = False,
                   rounded=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over ``operands``' output, in blocks of ``block`` tokens (checkpointed for the backward
    when ``checkpointed``); returns (o (N, T, HV, V), final state (N, HV, K, V)). ``rounded`` as
    ``recurrence_steps``."""
    q, v = ops["q"], ops["v"]
    n, steps, hv, dk, dv = *q.shape[:3], q.shape[-1], v.shape[-1]
    s = ops["h0"] if ops["h0"] is not None else q.new_zeros(n, hv, dk, dv)
    s = s.to(q.dtype)
    block = block or max(1, math.isqrt(steps))
    outs = []
    for start in range(0, steps, block):
        part = [None if ops[name] is None else ops[name][:, start:start + block]
                for name in ("q", "k", "v", "g", "beta")]
        if checkpointed:
            o, s = checkpoint(lambda s_, *p: recurrence_steps(spec, s_, *p, rounded=rounded), s, *part,
                              use_reentrant=False)
        else:
            o, s = recurrence_steps(spec, s, *part, rounded=rounded)
        outs.append(o)
    return torch.cat(outs, dim=1), s


def reference(spec: RecurrenceSpec, inputs: RecurrenceInputs, *, block: int | None = None,
              device: str | torch.device | None = None) -> Outputs:
    """Exact output, final state and (fwd_bwd) the gradient of every input of ``spec``, in fp64 (module doc).

    ``block``: tokens per checkpointed block (default sqrt(T)); ``device``: where to compute (default the
    inputs' device)."""
    validate(spec, inputs)

    def forward(leaves):
        o, state = run_recurrence(spec, operands(spec, leaves), block=block, checkpointed=spec.pass_ == "fwd_bwd")
        return finish(spec, o, leaves), state
    return with_gradients(spec, inputs, forward, dtype=torch.float64, device=device or inputs.q.device)

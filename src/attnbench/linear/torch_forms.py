"""The recurrence as a careful kernel computes it in PyTorch, in one dtype and differentiable: token by token, and
in chunks.

Both take q, k, v and beta in ``dtype`` (default: the case's dtype) and the gates and the state in fp32 (fp64 in an
fp64 case), as every kernel library keeps them (``inputs.FP32_INPUTS``), and return ``attnbench.outputs.Outputs``
in the reference's layout: ``out`` in ``dtype``, ``final_state`` in fp32 and, for ``fwd_bwd``, ``d<name>`` of each of
``spec.input_names`` through autograd (of the loss ``<out, dout> + <final_state, dfinal_state>``, as
``reference.reference``), each in its input's dtype.

``naive_recurrent``: ``reference.recurrence_steps``, the loop of the definition, computed in fp32 on those inputs
(as fla's ``fused_recurrent`` kernels load every operand into fp32 registers), the output rounded to ``dtype`` once.
It is the yardstick of the check: a yardstick whose gates and state were bf16 would be off by 0.7-1.3% in dv at
4096 tokens, 30 times more than good kernels, and would let a kernel 1% wrong pass.

``chunked``: the chunk form fla's kernels compute (fla-core 0.6.0 ``gated_delta_rule/naive.py:67-161``, the WY
representation; ``kda/naive.py:69-166`` per channel; mamba's ``ssd_minimal.py:34-78`` for the delta-free kinds),
its products in ``dtype`` as a tensor-core kernel's are, the state carried from chunk to chunk in fp32.
Per chunk of C tokens with state S₀ at its start and chunk-local cumulative log-decays γ_i = Σ_{j≤i} g_j:

    Γ_ij   = exp(γ_i − γ_j) for j ≤ i, else 0            (per channel for kda: inside the k-sum)
    U      = (I + tril(diag(β)(K Kᵀ ⊙ Γ), −1))⁻¹ diag(β) [V − (exp(γ) ⊙ K) S₀]     delta rule
    U      = V                                                                    linear, mamba2
    O      = scale · ((exp(γ) ⊙ Q) S₀ + (Q Kᵀ ⊙ Γ) U)       (Γ's diagonal included: o_t sees token t)
    S_next = exp(γ_C) S₀ + (exp(γ_C − γ) ⊙ K)ᵀ U

which follows from unrolling the recurrence over the chunk (U holds each token's ``beta·(v − Sᵀk)``). Every product
accumulates in fp32 from operands in ``dtype``; what a kernel hands to its next matmul (the decayed q and k, the
masked scores, U, the state it reads) is rounded to ``dtype``; the unit lower-triangular solve, the cumulative
log-decays γ and their exponentials and the carried state are fp32, as fla keeps them. A sequence is padded with
zero tokens to a whole number of chunks, which changes nothing (``inputs.pad_sequences``).
"""

from __future__ import annotations

import torch

from attnbench.linear.inputs import RecurrenceInputs, validate, with_gradients
from attnbench.linear.reference import finish, operands, run_recurrence
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs


def naive_recurrent(spec: RecurrenceSpec, inputs: RecurrenceInputs, *, dtype: torch.dtype | None = None) -> Outputs:
    """The token loop on inputs in ``dtype`` (default the case's), computed in fp32 (module doc): out, final_state
    and (fwd_bwd) the gradients."""
    return _run(spec, inputs, lambda t: careful_recurrent_form(spec, t), dtype or spec.torch_dtype)


def careful_recurrent_form(spec: RecurrenceSpec, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``recurrent_form`` computed in fp32 at least on the inputs by name, the output back in q's dtype (module
    doc): what ``naive_recurrent`` runs, and a model's layer can call on its own tensors."""
    tokens = t["q"].dtype
    acc = torch.promote_types(tokens, torch.float32)
    out, state = recurrent_form(spec, {name: x.to(acc) for name, x in t.items()},
                                rounded=lambda x: x.to(tokens).to(acc))
    return out.to(tokens), state


def chunked(spec: RecurrenceSpec, inputs: RecurrenceInputs, *, dtype: torch.dtype | None = None,
            chunk: int | None = None) -> Outputs:
    """The chunk form (module doc) in ``dtype`` with ``chunk`` tokens a chunk (default ``spec.chunk``)."""
    return _run(spec, inputs, lambda t: chunked_form(spec, t, chunk), dtype or spec.torch_dtype)


def recurrent_form(spec: RecurrenceSpec, t: dict[str, torch.Tensor], rounded=None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The token loop on the inputs by name (``spec.input_names``, the input layout), differentiable, in the dtype
    they come in: (out, final_state); ``rounded`` as ``reference.recurrence_steps``."""
    ops = operands(spec, t)
    if ops["h0"] is None:
        ops["h0"] = _zero_state(ops)
    # blocks of √T tokens, checkpointed under autograd: one state per block is kept, not one per token
    o, state = run_recurrence(spec, ops, checkpointed=torch.is_grad_enabled(), rounded=rounded)
    return finish(spec, o, t), state


def chunked_form(spec: RecurrenceSpec, t: dict[str, torch.Tensor], chunk: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk form on the inputs by name, as ``recurrent_form``; ``chunk`` tokens a chunk (default
    ``spec.chunk``)."""
    o, state = chunk_steps(spec, operands(spec, t), chunk or spec.chunk)
    return finish(spec, o, t).to(t["q"].dtype), state


def chunk_steps(spec: RecurrenceSpec, ops: dict, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.operands``' output -> (o (N, T, HV, V), final state), a chunk of ``size`` tokens at a time."""
    steps = ops["q"].shape[1]
    pad = (-steps) % size
    tokens = ops["q"].dtype  # Mamba2's dt·x comes out in the step's fp32: back to the tokens' dtype, as a kernel's x
    ops = {**ops, **{name: ops[name].to(tokens) for name in ("v", "beta") if ops[name] is not None}}
    seq = {name: _pad_time(ops[name], pad) for name in ("q", "k", "v", "g", "beta")}
    s = ops["h0"] if ops["h0"] is not None else _zero_state(ops)
    outs = []
    for start in range(0, steps + pad, size):
        part = {name: None if x is None else x[:, start:start + size].transpose(1, 2) for name, x in seq.items()}
        o, s = _one_chunk(spec, s, **part)
        outs.append(o.transpose(1, 2))
    return torch.cat(outs, dim=1)[:, :steps], s


CHUNK_TEMP_BYTES = {(False, "fwd"): 44, (False, "fwd_bwd"): 50, (True, "fwd"): 18, (True, "fwd_bwd"): 24}
"""Bytes held per element of a chunk's C x C (kda: C x C x K) matrices, per sequence and value head, keyed by
(per-channel decay, pass): the decays, Q Kᵀ, K Kᵀ, the solve's matrix, their fp32 accumulators and rounded copies.
Peak RSS on a CPU (bf16, d_k 32, C 256-1024, two chunks): gdn 41 in a forward, 47 per chunk in a fwd_bwd (autograd
keeps every chunk's); kda 17 and 21. Not rounded down: on a CPU running out is the OOM killer, not an exception."""


def chunk_workspace_bytes(spec: RecurrenceSpec, chunk: int | None = None) -> int:
    """Bytes the chunk form's per-chunk temporaries take (``CHUNK_TEMP_BYTES``): one chunk's in a forward, every
    chunk's in a fwd_bwd. A sequence is padded to a whole number of chunks, so a chunk longer than the sequence
    costs its full C x C."""
    size = chunk or spec.chunk
    chunks = -(-max(spec.seqlens) // size) if spec.pass_ == "fwd_bwd" else 1
    per_chunk = spec.num_seqs * spec.heads_v * size * size * (spec.d_k if spec.per_channel else 1)
    return per_chunk * chunks * CHUNK_TEMP_BYTES[(spec.per_channel, spec.pass_)]


def _one_chunk(spec: RecurrenceSpec, s, q, k, v, g, beta):
    """One chunk, head-major operands (N, HV, C, ·), state (N, HV, K, V) -> (o (N, HV, C, V), next state).

    Computed as a tensor-core kernel does: every product accumulated in fp32 (``acc``) from operands in the tokens'
    dtype, and rounded to that dtype (``rnd``) only where a kernel feeds a product to the next matmul — the decayed
    q and k, the masked scores, U and the state it reads — while the gates, their exponentials and the carried state
    stay fp32."""
    size = q.shape[2]
    tokens = q.dtype
    acc = torch.promote_types(tokens, torch.float32)
    rnd = lambda x: x.to(tokens).to(acc)  # noqa: E731  (an operand handed to the next matmul)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)  # j > i: not yet seen
    if g is None:
        gam = None
        qk = rnd((q @ k.transpose(-1, -2)).masked_fill(later, 0))
        kk = k @ k.transpose(-1, -2)
        q_read, k_read, k_write = q, k, k
    else:
        # cumulative log-decays in fp32 at least (as chunk kernels keep them): in bf16 a chunk's sum of Mamba2's
        # A·dt (down to -100) is off by ~0.4, its decays by 40%
        gam = g.to(torch.promote_types(g.dtype, acc)).cumsum(2)  # (N, HV, C) or (N, HV, C, K)
        if spec.per_channel:
            diff = (gam[:, :, :, None] - gam[:, :, None]).masked_fill(later[..., None], float("-inf"))
            decay = torch.exp(diff).to(acc)  # (N, HV, C, C, K)
            qk = rnd(torch.einsum("nhik,nhjk,nhijk->nhij", q, k, decay))
            kk = torch.einsum("nhik,nhjk,nhijk->nhij", k, k, decay)
            q_read, k_read = rnd(q * torch.exp(gam).to(acc)), rnd(k * torch.exp(gam).to(acc))
            k_write = rnd(k * torch.exp(gam[:, :, -1:] - gam).to(acc))
        else:
            decay = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(later, float("-inf"))).to(acc)
            qk = rnd((q @ k.transpose(-1, -2)) * decay)
            kk = (k @ k.transpose(-1, -2)) * decay
            q_read, k_read = rnd(q * torch.exp(gam).to(acc)[..., None]), rnd(k * torch.exp(gam).to(acc)[..., None])
            k_write = rnd(k * torch.exp(gam[..., -1:] - gam).to(acc)[..., None])
    s_read = rnd(s.to(acc))
    if spec.delta:
        beta = beta.to(acc)
        lower = (beta[..., None] * kk).masked_fill(~later.T.tril(-1), 0)  # strictly before: j < i
        eye = torch.eye(size, dtype=acc, device=q.device)
        rhs = beta[..., None] * (v - k_read @ s_read)
        u = rnd(torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True))
    else:
        u = v
    o = spec.qk_scale * (q_read @ s_read + qk @ u)
    if gam is None:
        s_next = s + k_write.transpose(-1, -2) @ u
    else:
        last = torch.exp(gam[:, :, -1]).to(acc)
        s_next = s * (last[..., None] if spec.per_channel else last[..., None, None]) + k_write.transpose(-1, -2) @ u
    return o.to(tokens), s_next


def _pad_time(x, pad: int):
    if x is None or not pad:
        return x
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))


def _zero_state(ops: dict) -> torch.Tensor:
    q, v = ops["q"], ops["v"]
    return q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])


def _run(spec: RecurrenceSpec, inputs: RecurrenceInputs, forward, dtype: torch.dtype) -> Outputs:
    """Leaves in ``dtype``, gates and state in fp32 at least -> forward(leaves) = (out, state) -> Outputs, with
    autograd's gradients for fwd_bwd."""
    validate(spec, inputs)
    return with_gradients(spec, inputs, forward, dtype=dtype, gates=torch.promote_types(dtype, torch.float32))

"""The recurrence written out one sequence, one value head, one token at a time (fp64 by default), with the
mistakes a kernel could make, and the verdict the accuracy check gives a recurrence's outputs."""

from __future__ import annotations

import torch

from attnbench.accuracy.compare import compare
from attnbench.accuracy.tolerance import judge
from attnbench.outputs import Outputs, grad_name

MISTAKES = ("gate-after", "no-beta", "chunk-reset", "wrong-head")


def bounds(spec, inputs):
    """(row of the input tensors, first token, end) of each sequence."""
    if spec.is_varlen:
        cu = inputs.cu_seqlens.tolist()
        return [(0, cu[n], cu[n + 1]) for n in range(spec.num_seqs)]
    return [(n, 0, spec.seqlens[0]) for n in range(spec.num_seqs)]


def written_out(spec, inputs, *, mistake=None, dtype=torch.float64):
    """out, final_state and (fwd_bwd) the gradients of the recurrence written out; ``mistake`` one of MISTAKES:
    the decay applied after the update, beta ignored, the state dropped at every chunk's end, value head hv
    reading q/k head hv % H instead of hv // (HV / H)."""
    grads = spec.pass_ == "fwd_bwd"
    t = {n: inputs.tensor(n).detach().to(dtype).requires_grad_(grads) for n in spec.input_names}
    q, k, v = t["q"], t["k"], t["v"]
    outs, finals = {}, []
    for n, (b, start, end) in enumerate(bounds(spec, inputs)):
        heads = []
        for hv in range(spec.heads_v):
            h = hv % spec.heads_qk if mistake == "wrong-head" else hv // spec.group
            s = t["initial_state"][n, hv] if spec.initial_state else torch.zeros(spec.d_k, spec.d_v, dtype=dtype)
            for i in range(start, end):
                q_i, k_i, v_i = q[b, i, h], k[b, i, h], v[b, i, hv]
                if spec.l2norm:
                    q_i = q_i / torch.sqrt(q_i @ q_i + 1e-6)
                    k_i = k_i / torch.sqrt(k_i @ k_i + 1e-6)
                decay = None
                if spec.kind == "mamba2":
                    decay = torch.exp(t["A"][hv] * t["dt"][b, i, hv])
                    v_i = t["dt"][b, i, hv] * v_i
                elif spec.gated:
                    decay = torch.exp(t["g"][b, i, hv])
                    decay = decay[:, None] if spec.per_channel else decay
                if decay is not None and mistake != "gate-after":
                    s = decay * s
                u = v_i
                if spec.delta:
                    u = (v_i - s.T @ k_i) * (1.0 if mistake == "no-beta" else t["beta"][b, i, hv])
                s = s + torch.outer(k_i, u)
                if decay is not None and mistake == "gate-after":
                    s = decay * s
                o = spec.qk_scale * (s.T @ q_i)
                if spec.skip:
                    o = o + t["D"][hv] * v[b, i, hv]
                outs[b, i, hv] = o
                if mistake == "chunk-reset" and (i - start + 1) % spec.chunk == 0:
                    s = torch.zeros_like(s)
            heads.append(s)
        finals.append(torch.stack(heads))
    rows, steps = v.shape[:2]
    out = torch.stack([torch.stack([torch.stack([outs[b, i, hv] for hv in range(spec.heads_v)])
                                    for i in range(steps)]) for b in range(rows)])
    state = torch.stack(finals)
    result = Outputs(out=out.detach(), final_state=state.detach())
    if grads:
        got = torch.autograd.grad((out, state), list(t.values()),
                                  (inputs.dout.to(dtype), inputs.dfinal_state.to(dtype)), allow_unused=True)
        for name, leaf, grad in zip(t, t.values(), got):
            result[grad_name(name)] = torch.zeros_like(leaf) if grad is None else grad
    return result


def verdict(got: Outputs, ref: Outputs, baseline: Outputs, dtype: str) -> dict:
    """The accuracy check's verdict on ``got``: every tensor the reference names, held to k x the baseline's
    error against the same reference (``attnbench.accuracy.tolerance``); a tensor not returned fails."""
    missing = tuple(name for name in ref if name not in got)
    metrics = compare(got.tensors(), ref.tensors())
    return judge(metrics, compare(baseline.tensors(), ref.tensors()), dtype, exact=True, missing=missing)


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    """‖x − y‖ / ‖y‖ in fp64."""
    x, y = x.double(), y.double()
    return float((x - y).norm() / y.norm())


def as_kernel(outputs: Outputs, spec, inputs) -> Outputs:
    """Outputs as a kernel returns them: out in the case's dtype, each gradient in its input's dtype, the final
    state in fp32."""
    dtypes = {"out": spec.torch_dtype, "final_state": torch.float32}
    dtypes.update({grad_name(n): inputs.tensor(n).dtype for n in spec.input_names})
    return Outputs(**{n: x.to(dtypes[n]) for n, x in outputs.tensors().items()})

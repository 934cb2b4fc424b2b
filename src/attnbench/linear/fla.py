"""fla-core 0.6.0's kernels for a recurrence case, returning ``Outputs`` in the reference's layout.

``supports(spec, op)`` says why a case cannot run (or None); ``prepare(spec, inputs, op)`` returns a
zero-argument closure that runs the kernel on the case's inputs and returns ``out`` (B, T, HV, V), ``final_state``
(N, HV, K, V) and, for ``fwd_bwd``, ``d<name>`` of each of ``spec.input_names`` — the names and shapes of
``reference.reference``. ``op``: ``chunk`` (``chunk_*``) or ``recurrent`` (``fused_recurrent_*``).

The calls, against fla-core 0.6.0's signatures (``fla/ops``):

- gdn: ``gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
  use_qk_l2norm_in_kernel, cu_seqlens, chunk_size=)`` (``chunk.py:397``; chunk 16, 32 or 64) and
  ``fused_recurrent_gated_delta_rule(q, k, v, g=, beta=, ...)`` (``fused_recurrent.py:309``), whose backward
  raises NotImplementedError (``:301``): forward only. Ungated gdn (DeltaNet) passes g = 0.
- kda: ``kda.chunk_kda`` (``chunk.py:216``; chunk 32 or 64, d_k ≤ 256, an fp32 initial state) and
  ``kda.fused_recurrent_kda`` (``fused_recurrent.py:338``; no autograd: forward only).
- linear: ``simple_gla.chunk_simple_gla(q, k, v, g, scale=, initial_state=, output_final_state=, cu_seqlens=,
  chunk_size=)`` (``chunk.py:238``) and ``fused_recurrent_simple_gla`` (``fused_recurrent.py:17``). simple GLA has
  no value-head groups and no in-kernel L2 norm: q and k are expanded to the value heads and normalised by torch
  ops outside the kernel (their gradients flow back through them).
- mamba2: SSD is scalar-gated linear attention (mamba's ``ssd_minimal.py:103`` calls its reference with
  ``X·dt, A·dt``): simple GLA with q = C, k = B, v = dt·x (rounded to x's dtype), g = A·dt, scale 1, and
  ``+ D·x`` by torch ops; mamba_ssm's own ``mamba_chunk_scan_combined`` would be another kernel, with the state
  transposed to (N, HV, V, K).

The initial state and ``dfinal_state`` are handed as they are (fp32); gates in fp32; varlen cases pass the
packed (1, total, ...) tensors with int64 ``cu_seqlens``. fla is imported inside the functions: this module
loads without it (and without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.linear.inputs import RecurrenceInputs, validate
from attnbench.linear.reference import expand_heads, l2norm
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs, grad_name

OPS = ("chunk", "recurrent")
CHUNK_SIZES = {"gdn": (16, 32, 64), "kda": (32, 64)}
"""Chunk sizes fla-core 0.6.0 accepts (``gated_delta_rule/chunk.py:539``, ``kda/chunk.py:475``); simple GLA
(linear, mamba2) takes any power of two (``simple_gla/chunk.py:326``)."""
KDA_MAX_DK = 256
"""``chunk_kda`` asserts d_k <= 256 (``kda/chunk.py:486``)."""


def supports(spec: RecurrenceSpec, op: str = "chunk") -> str | None:
    """Why fla cannot run ``spec`` with ``op`` here (no GPU, no fla, an unsupported size or pass), or None."""
    if op not in OPS:
        raise ValueError(f"unknown fla op {op!r}; allowed: {', '.join(OPS)}")
    if op == "recurrent" and spec.pass_ == "fwd_bwd" and spec.delta:
        return f"fla's fused_recurrent {spec.kind} has no backward: fwd only"
    if op == "chunk":
        sizes = CHUNK_SIZES.get(spec.kind)
        if sizes is not None and spec.chunk not in sizes:
            return f"fla's chunk {spec.kind} takes chunk sizes {sizes}, not {spec.chunk}"
        if sizes is None and spec.chunk & (spec.chunk - 1):
            return f"fla's chunk_simple_gla takes a power-of-two chunk size, not {spec.chunk}"
        if spec.kind == "kda" and spec.d_k > KDA_MAX_DK:
            return f"fla's chunk_kda takes d_k up to {KDA_MAX_DK}, not {spec.d_k}"
    if spec.dtype == "fp64":
        return "fla's Triton kernels take fp16, bf16 or fp32"
    if not torch.cuda.is_available():
        return "fla's Triton kernels need a GPU"
    try:
        import fla.ops  # noqa: F401
    except ImportError as exc:
        return f"fla-core is not installed ({exc})"
    if op == "chunk" and spec.pass_ == "fwd_bwd" and spec.kind in GATED_BACKWARD and (why := _gated_backward_reason()):
        return why
    return None


GATED_BACKWARD = ("gdn", "kda", "linear", "mamba2")
"""Chunk kinds whose backward runs fla's gated chunk_bwd_dqkwg, which fla refuses on Hopper with Triton 3.4-3.7.0."""


def _gated_backward_reason() -> str | None:
    """fla 0.6.0 raises in its gated chunk backward on Hopper with Triton >= 3.4, < 3.7.1 ("produces incorrect
    results", fla#640) unless TileLang is installed: the same refusal, before the case runs."""
    import importlib.util

    import triton
    major, minor = torch.cuda.get_device_capability()
    version = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3])
    if major != 9 or not (3, 4, 0) <= version < (3, 7, 1) or importlib.util.find_spec("tilelang") is not None:
        return None
    return (f"fla's gated chunk backward refuses Triton {triton.__version__} on Hopper (wrong results, fla#640): it "
            "needs Triton >= 3.7.1 or tilelang")


def kernel_name(spec: RecurrenceSpec, op: str = "chunk") -> str:
    """The fla function a case calls (``kernel``)."""
    base = {"gdn": "gated_delta_rule", "kda": "kda"}.get(spec.kind, "simple_gla")
    return f"fla.ops.{'chunk' if op == 'chunk' else 'fused_recurrent'}_{base}"


def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, op: str = "chunk") -> Callable[[], Outputs]:
    """A closure running fla's ``op`` on ``inputs``: each call returns Outputs (module doc)."""
    validate(spec, inputs)
    if (why := supports(spec, op)) is not None:
        raise ValueError(why)
    call = kernel(spec, op)
    grads = spec.pass_ == "fwd_bwd"

    def run() -> Outputs:
        leaves = {name: inputs.tensor(name).detach().requires_grad_(grads) for name in spec.input_names}
        with torch.enable_grad() if grads else torch.no_grad():
            out, state = call(leaves, inputs.cu_seqlens)
        result = Outputs(out=out.detach(), final_state=state.detach())
        if grads:
            got = torch.autograd.grad((out, state), list(leaves.values()), (inputs.dout, inputs.dfinal_state),
                                      allow_unused=True)
            for name, leaf, grad in zip(leaves, leaves.values(), got):
                result[grad_name(name)] = torch.zeros_like(leaf) if grad is None else grad
        return result
    return run


def kernel(spec: RecurrenceSpec, op: str):
    """(leaves by name, cu_seqlens) -> (out, final_state) through the fla call of ``spec.kind`` and ``op``:
    differentiable, on any tensors of the case's shapes (``prepare`` closes it over the inputs, a model's layer calls
    it through ``backends.FlaChunk.functional``)."""
    common = dict(scale=spec.qk_scale, output_final_state=True)
    chunk = dict(chunk_size=spec.chunk) if op == "chunk" else {}

    if spec.delta:
        def delta(t, cu):
            if spec.kind == "gdn":
                from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
                fn = chunk_gated_delta_rule if op == "chunk" else fused_recurrent_gated_delta_rule
            else:
                from fla.ops.kda import chunk_kda, fused_recurrent_kda
                fn = chunk_kda if op == "chunk" else fused_recurrent_kda
            g = t["g"] if "g" in t else t["beta"].new_zeros(t["beta"].shape, dtype=torch.float32)
            return fn(t["q"], t["k"], t["v"], g=g, beta=t["beta"], initial_state=t.get("initial_state"),
                      use_qk_l2norm_in_kernel=spec.l2norm, cu_seqlens=cu, **common, **chunk)
        return delta

    def gla(t, cu):
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
        fn = chunk_simple_gla if op == "chunk" else fused_recurrent_simple_gla
        q, k, v, g = t["q"], t["k"], t["v"], t.get("g")
        if spec.l2norm:
            q, k = l2norm(q), l2norm(k)
        q, k = expand_heads(q, spec.group), expand_heads(k, spec.group)
        if spec.kind == "mamba2":
            g = t["A"] * t["dt"]
            v = (v * t["dt"][..., None]).to(v.dtype)
        o, state = fn(q, k, v, g=g, initial_state=t.get("initial_state"), cu_seqlens=cu, **common, **chunk)
        if spec.skip:
            o = o + (t["D"][:, None] * t["v"]).to(o.dtype)
        return o, state
    return gla

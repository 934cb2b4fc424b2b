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

fla dispatches some functions to other backends before its own Triton (``fla/backends.py``): with flash_qla
installed it hands gdn's ``chunk_gated_delta_rule`` to FlashQLA (refused here as not fla's kernel: FLA_FLASH_QLA=0
keeps fla's own), and with tilelang installed its gated ``chunk_bwd_dqkwg`` goes to a TileLang kernel, the only way
past its refusal of that backward on Hopper with Triton 3.4-3.7.0 (``_gated_backward_reason``).

The initial state and ``dfinal_state`` are handed as they are (fp32); gates in fp32; varlen cases pass the
packed (1, total, ...) tensors with int64 ``cu_seqlens``. fla is imported inside the functions: this module
loads without it (and without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.linear.inputs import RecurrenceInputs, kernel_closure
from attnbench.linear.reference import expand_heads, l2norm
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs

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
    if op == "chunk" and spec.kind == "gdn" and _flash_qla_takes(spec):
        return ("fla-core 0.6.0 hands chunk_gated_delta_rule to FlashQLA here (flash_qla is installed): "
                "FLA_FLASH_QLA=0 keeps fla's own kernels")
    if op == "chunk" and spec.pass_ == "fwd_bwd" and _calls_gated_dqkwg(spec):
        return _gated_backward_reason(spec)
    return None


GATED_BACKWARD = ("gdn", "linear", "mamba2")
"""Chunk kinds whose backward calls fla's ``common.chunk_o.chunk_bwd_dqkwg`` with a decay g, which fla 0.6.0 refuses
on Hopper with Triton 3.4-3.7.0 (``chunk_o.py:727``) unless its TileLang backend takes the call: gdn always
(attnbench hands ungated DeltaNet g = 0), linear when gated, mamba2. KDA's backward (``kda/chunk_bwd.py``) never
calls it, and an ungated linear passes g = None, which fla lets through."""


def _calls_gated_dqkwg(spec: RecurrenceSpec) -> bool:
    return spec.kind in GATED_BACKWARD and (spec.gated or spec.kind == "gdn")


def _gated_backward_reason(spec: RecurrenceSpec) -> str | None:
    """Why fla 0.6.0 raises in the gated chunk backward of ``spec`` (a gdn, gated linear or mamba2 case), or None.

    fla's ``chunk_bwd_dqkwg`` is a dispatched function (``fla/backends.py``): its TileLang backend
    (``common/backends/tilelang``) runs first when it is available and enabled and its verifier takes the call, and
    only the Triton fallback raises, on Hopper (``IS_NVIDIA_HOPPER``: a device name with "NVIDIA H" or capability 9.x)
    with Triton >= 3.4.0 and < 3.7.1 ("produces incorrect results", fla#640). The same flags and checks, read from
    fla itself, before the case runs. An fla without these names (not 0.6.0) is not second-guessed."""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return None
    if not (IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1):
        return None
    if (closed := _tilelang_declines(spec)) is None:
        return None
    import triton
    return (f"fla's gated chunk backward refuses Triton {triton.__version__} on Hopper (wrong results, fla#640): it "
            f"needs Triton >= 3.7.1 or its TileLang kernel, which does not take this case: {closed}")


def _tilelang_declines(spec: RecurrenceSpec) -> str | None:
    """Why fla 0.6.0's TileLang ``chunk_bwd_dqkwg`` would not take the case, or None. fla tries it when backend
    dispatch is on (not ``FLA_DISABLE_BACKEND_DISPATCH=1``), ``tilelang`` is importable, an nvcc is found
    (``has_usable_nvcc``: CUDA_HOME or CUDA_PATH, PATH, the nvidia-cuda-nvcc wheel, /usr/local/cuda) and
    ``FLA_TILELANG`` is not 0 (on by default on Hopper with Triton >= 3.4); its verifier wants a decay g (always here),
    value heads a multiple of q/k heads (always) and the states ``h`` in q's dtype, which simple GLA's backward keeps
    in fp32 (``simple_gla/chunk.py``: ``states_in_fp32=True``), so linear and mamba2 pass only as fp32 cases."""
    try:
        from fla.backends import _DISPATCH_DISABLED
        from fla.ops.common.backends.tilelang import CommonTileLangBackend
        from fla.utils import find_spec_cached, has_usable_nvcc
    except ImportError:  # another fla than 0.6.0: not second-guessed
        return None
    if _DISPATCH_DISABLED:
        return "FLA_DISABLE_BACKEND_DISPATCH=1 turns fla's backends off"
    if find_spec_cached("tilelang") is None:
        return "tilelang is not installed"
    if not has_usable_nvcc():
        return "tilelang is installed but fla finds no nvcc (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"
    if not CommonTileLangBackend().is_enabled():
        return "FLA_TILELANG=0"
    if spec.kind != "gdn" and spec.dtype != "fp32":
        return (f"it takes the states in q's dtype ({spec.dtype}) and simple GLA's backward keeps them in fp32 "
                "(fp32 cases only)")
    return None


def _flash_qla_takes(spec: RecurrenceSpec) -> bool:
    """Whether fla 0.6.0 hands ``chunk_gated_delta_rule`` (forward and backward) to FlashQLA
    (``gated_delta_rule/backends/flash_qla.py``, priority 3, before its own kernels): ``flash_qla`` importable,
    ``FLA_FLASH_QLA`` not 0, and its verifier's sm90 / sm100 / sm120 (sm120: bf16 forward only), fp16 or bf16,
    d_k = d_v = 128. The chunk size is then FlashQLA's own (64; 32 on sm120), not the case's."""
    try:
        from fla.backends import _DISPATCH_DISABLED
        from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend
        from fla.utils import IS_NVIDIA_HOPPER, IS_NVIDIA_SM100, IS_NVIDIA_SM120
    except ImportError:
        return False
    if _DISPATCH_DISABLED or not (FlashQLABackend.is_available() and FlashQLABackend().is_enabled()):
        return False
    if not (IS_NVIDIA_HOPPER or IS_NVIDIA_SM100 or IS_NVIDIA_SM120):
        return False
    if IS_NVIDIA_SM120 and (spec.pass_ == "fwd_bwd" or spec.dtype != "bf16"):
        return False
    return spec.dtype in ("fp16", "bf16") and spec.d_k == 128 and spec.d_v == 128


def kernel_name(spec: RecurrenceSpec, op: str = "chunk") -> str:
    """The fla function a case calls (``kernel``)."""
    base = {"gdn": "gated_delta_rule", "kda": "kda"}.get(spec.kind, "simple_gla")
    return f"fla.ops.{'chunk' if op == 'chunk' else 'fused_recurrent'}_{base}"


def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, op: str = "chunk") -> Callable[[], Outputs]:
    """A closure running fla's ``op`` on ``inputs``: each call returns Outputs (module doc)."""
    return kernel_closure(spec, inputs, supports(spec, op), lambda: kernel(spec, op))


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

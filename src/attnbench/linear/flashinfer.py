"""FlashInfer 0.7.2.post1's Gated DeltaNet kernels for a recurrence case, returning ``Outputs`` in the reference's
layout: ``out`` in v's input layout, ``final_state`` (N, HV, K, V). Read from the wheel's source (docs/linear.md,
"FlashInfer 0.7.2.post1"); run on an H200 (docs/results/2026-11-28-h200-recurrences.md). ``flashinfer`` is
imported inside the functions: this module loads without it. Line numbers are those of the 0.7.2.post1 wheel.

- ``prefill``: ``flashinfer.gdn_prefill.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
  output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, ..., use_cp="auto", ..., max_seqlen=)``
  (``gdn_prefill.py:617-638``). q, k (total, H, D), v (total, HV, D), packed: ``cu_seqlens`` is always required
  (``:826``), so a dense case is handed as B sequences of T packed tokens, with ``max_seqlen`` the longest. One head
  size D for K and V (the state is (D, D)); value head hv reads q/k head ``hv // (HV / H)``
  (``delta_rule_sm90.py:208``, ``trace/templates/gdn.py:278``), as the reference. ``g`` is the decay itself,
  not its log: "Forget gate (alpha) ... Defaults to all ones" (``:657-659``); the SM90 kernel takes
  ``log2(alpha + 1e-10)`` of it (``gdn_kernels/delta_rule_dsl/alpha.py:37``) and FlashInfer's own reference
  computes ``g = exp(-exp(A_log)·softplus(a + dt_bias))`` (``trace/templates/gdn.py:275``): the case's log-decay
  is handed as ``exp(g)``, an ungated case (DeltaNet) as ``g=None``. ``beta`` is the strength itself (the
  reference's ``sigmoid(b)``, ``:276``). g and beta are fp32 (T, HV), contiguous (``:658-662``,
  ``delta_rule_sm90.py:2434-2437``). The state, initial and final, is stored transposed, (N, HV, V, K) ("The
  final state layout is ``[N, H, V, K]``", ``:783``; the reference's ``transpose(-1, -2)`` both ways,
  ``trace/templates/gdn.py:299,331``): the initial state is handed transposed and contiguous, the final state
  comes back through the same transpose; fp32 by default. ``scale`` None *or 0* means 1/sqrt(D) (``:940``).
  ``use_qk_l2norm_in_kernel`` is not done in the chunk kernel: on sm90/100/120 the wrapper first runs its own
  CuTe DSL pass ``gdn_kernels/qk_l2norm.normalize_qk`` (``:1008-1021``), x·rsqrt(Σx² + 1e-6) in fp32 rounded
  back to q's dtype (the reference's definition, then a rounding), inside the timed call.
  Routing (``:942-961``): with ``use_cp="auto"`` a call whose N·HV is below half the SM count (HBM GPUs;
  ``varlen_helper.should_use_cp_host``) goes to the context-parallel kernel ``cp_delta_rule_dsl_sm90`` (sm90),
  which splits each sequence over the GPU — Qwen3.5 at B = 1 (64 value heads) on an H200's 132 SMs does —; any
  other call to ``chunk_gated_delta_rule_sm90`` (one CTA per sequence and value head, ``delta_rule_sm90.py:55``).
  ``use_cp=True/False`` forces either. Kernels: SM90, SM100/SM103 and SM120 (``:1161-1273``; any other arch raises
  NotImplementedError, ``:1273``); D must be 128 (SM100 ``:1170``, SM90 ``delta_rule_sm90.py:2415-2416``, SM120
  ``delta_rule_sm120.py:2071-2072``); fp16/bf16 q, k, v (``delta_rule_sm90.py:2422-2428``); SM100 needs CUDA 13
  (``:1162-1165``). Chunks are 64 tokens (``BLK_Q = BLK_KV = 64``, ``delta_rule_sm90.py:159-160``). Forward only:
  a plain call, no autograd Function. Without a working CuTe DSL (``import cutlass``; the ``nvidia-cutlass-dsl``
  wheels put it on the path through a ``.pth`` file, which ``PYTHONPATH`` does not read) ``import flashinfer``
  still succeeds (``__init__.py:183-195`` suppresses the ImportError) but ``flashinfer.gdn_prefill`` does not
  import (``varlen_helper.py:4``); a kernel module failing otherwise leaves its function None
  (``gdn_kernels/__init__.py:102-112``) and the call raises "SM90 GDN prefill DSL kernel is unavailable"
  (``:1247``): ``kernel_reason`` says which, before a case runs.
  The compiled sm90 prefill kernels are cached in memory only (``custom_compile_cache.py``): each process compiles.
- ``decode``: ``flashinfer.gdn_decode.gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale,
  output=None, use_qk_l2norm=True, backend="auto")`` (``gdn_decode.py:1151-1164``), q, k (B, 1, H, K), v
  (B, 1, HV, V), the state (B, HV, K, V) fp32, "K-major ... no transpose needed" (``:1165,1180``) — the
  reference's layout — and updated in place (``:1181``). The kernel computes its gates itself:
  ``g = -exp(A_log)·softplus(a + dt_bias)`` (softplus with threshold 20), decay ``exp(g)``, ``beta = sigmoid(b)``
  (``gdn_kernels/gdn_decode_nontranspose.py:144-158, 846-847``). The case's g and beta are handed as
  ``A_log = dt_bias = 0`` (fp32), ``a = softplus⁻¹(−g)`` and ``b = logit(beta)``, a and b in the case's dtype as
  documented (``:1185-1191``): their rounding is an error the reference does not have. g must be < 0 (an ungated
  case cannot be expressed). K, V ≥ 128, V a multiple of 32, q fp16/bf16 (``:1232-1243``); the kernel writes
  bf16 ("Kernel outputs bfloat16", ``:1260``; an fp16 case would get a bf16 result converted, ``:1322-1323``),
  so only bf16 cases are taken. "Requires SM90 (Hopper)" (``:1212``; no check in the code: it compiles for the
  device's arch). In-kernel L2 norm x·rsqrt(Σx² + 1e-6) (``gdn_decode_nontranspose.py:203-204``). Value head hv
  reads q/k head ``hv // (HV // H)`` (``:96``). ``backend="auto"`` tries the Cake kernels first, sm100/sm103 only
  (``jit/cake_gdn.py:810-817``): on sm90 they refuse and the CuTe DSL kernel runs. Batches below 32 take the
  small-batch kernel, others the big-batch one (``SMALL_BATCH_THRESHOLD_NT``, ``gdn_decode_nontranspose.py:52``);
  both compile once per (B class, H, HV, dtypes, scale) into FlashInfer's disk cache. Because the state is updated
  in place, each call first copies the case's initial state into the kernel's buffer (``reset_state``, default: a read and a write of
  the whole state, as much traffic as the kernel's own, timed with it); with ``reset_state=False`` the state runs
  on from call to call and every checked call starts from the case's state (``_Decode.rewind``, the backend's
``Prepared.rewind``).
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



USE_CP = {"auto": "auto", "always": True, "never": False}
"""The prefill backend's ``use_cp`` option -> ``chunk_gated_delta_rule``'s ``use_cp`` (``gdn_prefill.py:958-961``)."""
PREFILL_KERNELS = {9: ("chunk_gated_delta_rule_sm90", "cp_delta_rule_dsl_sm90"),
                   10: ("chunk_gated_delta_rule_sm100", "cp_delta_rule_dsl_sm100"),
                   12: ("chunk_gated_delta_rule_sm120", "cp_delta_rule_dsl_sm120")}
"""``flashinfer.gdn_kernels``' prefill functions by compute-capability major: (one CTA per sequence and head,
context-parallel); None there when their module did not import."""


def kernel_reason(op: str, major: int) -> str | None:
    """Why FlashInfer's GDN ``op`` kernel is not there on a GPU of compute-capability ``major`` although the package
    imports (module doc: ``flashinfer.gdn_prefill`` needs ``import cutlass``; a kernel module that fails to import
    leaves its function None), or None."""
    try:
        if op == "prefill":
            import flashinfer.gdn_kernels as kernels
            import flashinfer.gdn_prefill  # noqa: F401  (imports cutlass unguarded)
            missing = [name for name in PREFILL_KERNELS.get(major, ()) if getattr(kernels, name, None) is None]
        else:
            import flashinfer.gdn_decode as decode
            missing = [] if getattr(decode, "run_nontranspose_decode", None) is not None else \
                ["gdn_kernels.gdn_decode_nontranspose.run_nontranspose_decode"]
    except Exception as exc:  # ImportError, or a broken DSL install raising anything on import
        return f"flashinfer's GDN {op} does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if not missing:
        return None
    try:
        import cutlass  # noqa: F401
        why = "their modules failed to import"
    except Exception as exc:
        why = f"import cutlass: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} (nvidia-cutlass-dsl)"
    return f"flashinfer's CuTe DSL kernel(s) {', '.join(missing)} unavailable: {why}"


def cp_route(spec: RecurrenceSpec, device) -> bool | None:
    """Whether ``chunk_gated_delta_rule(use_cp="auto")`` sends ``spec`` to its context-parallel kernel on ``device``:
    FlashInfer's own test on N·HV, the SM count and the device name (``gdn_prefill.py:942-961``); None when it
    cannot be asked (no CUDA device, no flashinfer)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host
    except Exception:
        return None
    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    return capability[0] in PREFILL_ARCHS and bool(should_use_cp_host(
        spec.num_seqs * spec.heads_v, props.multi_processor_count, props.name, device_capability=capability))


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


def prepare(spec: RecurrenceSpec, inputs: RecurrenceInputs, op: str = "prefill", *, use_cp: str = "auto",
            reset_state: bool = True) -> Callable[[], Outputs]:
    """A closure calling FlashInfer's GDN ``op`` on ``inputs``; the layouts are converted here, once, and the
    closure's results are converted back (module doc). ``use_cp`` (prefill): ``USE_CP``'s keys. ``reset_state``
    (decode): copy the case's initial state into the kernel's buffer at each call (else the first call only). A
    decode call's ``final_state`` is that buffer, overwritten by the next call: ``finish`` copies it. Checks the
    case only (``case_reason``), not the GPU."""
    validate(spec, inputs)
    if (why := case_reason(spec, op)) is not None:
        raise ValueError(why)
    if op == "prefill":
        if use_cp not in USE_CP:
            raise ValueError(f"use_cp must be one of {', '.join(USE_CP)}, not {use_cp!r}")
        return _prefill(spec, inputs, USE_CP[use_cp])
    return _Decode(spec, inputs, reset_state)


def finish(op: str) -> Callable[[Outputs], Outputs] | None:
    """``Prepared.finish`` for ``op``: decode's final state in memory of its own (the kernel's buffer is reused)."""
    if op != "decode":
        return None
    return lambda o: Outputs(out=o.out, final_state=o.final_state.clone())


def _prefill(spec: RecurrenceSpec, inputs: RecurrenceInputs, use_cp) -> Callable[[], Outputs]:
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    v_shape = inputs.v.shape
    q, k, v = (x.reshape(-1, *x.shape[-2:]).contiguous() for x in (inputs.q, inputs.k, inputs.v))
    heads_v = spec.heads_v
    g = None if inputs.g is None else torch.exp(inputs.g.float()).reshape(-1, heads_v).contiguous()
    beta = inputs.beta.float().reshape(-1, heads_v).contiguous()
    h0 = None if inputs.initial_state is None else inputs.initial_state.float().transpose(-1, -2).contiguous()
    cu = _offsets(spec, inputs, q.device)
    longest = max(spec.sequences)

    def call() -> Outputs:
        out, state = chunk_gated_delta_rule(q, k, v, g, beta, spec.qk_scale, initial_state=h0,
                                            output_final_state=True, cu_seqlens=cu,
                                            use_qk_l2norm_in_kernel=spec.l2norm, use_cp=use_cp, max_seqlen=longest)
        return Outputs(out=out.view(v_shape), final_state=state.transpose(-1, -2))
    return call


def decode_gates(g: torch.Tensor, beta: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) in ``dtype`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (A_log = dt_bias = 0): softplus⁻¹(y)
    = y + log(1 − exp(−y)), and y itself above the kernel's threshold."""
    y = -g.double()
    a = torch.where(y > SOFTPLUS_THRESHOLD, y, y + torch.log(-torch.expm1(-y)))
    b = beta.double()
    return a.to(dtype), (torch.log(b) - torch.log1p(-b)).to(dtype)


class _Decode:
    """A decode call into FlashInfer's in-place state buffer; ``rewind`` puts the case's state back in it."""

    def __init__(self, spec: RecurrenceSpec, inputs: RecurrenceInputs, reset_state: bool):
        from flashinfer.gdn_decode import gated_delta_rule_decode

        n, hv = spec.num_seqs, spec.heads_v
        self.kernel, self.spec, self.reset_state = gated_delta_rule_decode, spec, reset_state
        self.v_shape = inputs.v.shape
        self.q, self.k, self.v = (x.reshape(n, 1, *x.shape[-2:]).contiguous() for x in (inputs.q, inputs.k, inputs.v))
        self.a, self.b = decode_gates(inputs.g.reshape(n, 1, hv), inputs.beta.reshape(n, 1, hv), self.q.dtype)
        self.zeros = torch.zeros(hv, dtype=torch.float32, device=self.q.device)
        self.h0 = inputs.initial_state.float().contiguous()
        self.state = self.h0.clone()  # the kernel's buffer, updated in place

    def rewind(self) -> None:
        self.state.copy_(self.h0)

    def __call__(self) -> Outputs:
        if self.reset_state:
            self.rewind()
        out, final = self.kernel(self.q, self.k, self.v, self.state, self.zeros, self.a, self.zeros, self.b,
                                 scale=self.spec.qk_scale, use_qk_l2norm=self.spec.l2norm)
        return Outputs(out=out.view(self.v_shape), final_state=final)

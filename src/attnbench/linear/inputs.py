"""Seeded inputs of a recurrence case, in fla's layouts, with the gates made as the models make them.

Layouts (fla's ``chunk_gated_delta_rule`` / ``chunk_kda``): q, k (B, T, H, K); v, dout (B, T, HV, V); per-head
gates and beta (B, T, HV); KDA's per-channel decay (B, T, HV, K); states (N, HV, K, V). A varlen case packs its
sequences into B = 1 with int64 ``cu_seqlens`` (N+1,), as fla takes them. ``pad_sequences`` /
``unpad_sequences`` move between that layout and one row per sequence, (N, T_max, ...), zeros after each end.

Distributions (the point: every gating input changes the result by far more than bf16 rounding does, and none is ~1
or ~0 everywhere):

- q, k, v, dout: N(0, 1) in the case's dtype, drawn on the case's device (on a GPU from a generator of its own,
  so one seed gives a GPU case other values than a CPU case, as attention's inputs; the states too). A delta-rule
  case without in-op L2 normalisation gets q and k already L2-normalised per head, as its layer hands them (fla's
  docstring example normalises k): with raw N(0, 1) keys of d_k = 128, ``beta·|k|² > 2`` and the delta rule
  diverges.
- GDN (Qwen3-Next's ``GatedDeltaNet``; the layer files cited here are fla's GitHub ``fla/layers/`` at commit
  bc3b101, which the fla-core wheel does not ship: ``gated_deltanet.py:151-165``) and Mamba2
  (``layers/mamba2.py:205-219``): ``g = -exp(A_log) · softplus(a + dt_bias)`` per token and value head, with
  A = exp(A_log) in [1, 16], ``dt_bias = softplus⁻¹(dt0)``, dt0 log-uniform in [1e-3, 0.1] (the layers'
  initialisation; GDN's layer draws A from [0, 16], we take KDA's [1, 16] so that no head sits at decay 1)
  and the projection's output ``a`` ~ N(0, 1). So ``g ≈ -A·dt0·e^a``: per-token decays ``exp(g)`` with median
  0.93 and 5-95% range 0.55-0.99 (seed 0, 8 heads), heads from long memory to short. A and dt0 are drawn stratified over the value heads
  (one draw per 1/HV quantile, shuffled), so that even three heads cover the range. Mamba2's decay is the same
  number: ``dt = softplus(a + dt_bias)`` (its ``dt_softplus``), ``A = -exp(A_log)``, decay ``exp(A·dt)``.
- KDA (Kimi Linear, fla ``layers/kda.py:174-185``): the same with ``a`` and ``dt_bias`` per key channel
  (HV·K values), A per value head.
- linear (fla's ``SimpleGatedLinearAttention``, ``layers/simple_gla.py:227``): ``g = logsigmoid(a) / 16``,
  a ~ N(0, 1): per-token decay 0.83..0.997, median 0.96.
- beta = sigmoid(b), b ~ N(0, 1): mostly 0.15..0.85, median 0.5.
- Mamba2's D (``skip``): U(0.5, 1.5) per value head (its layer starts at 1).
- initial state and the final state's upstream gradient: N(0, 1), fp32.

Gates (g, dt, A, D) and states are fp32, as the models compute them (the layers form g in fp32 from an fp32
A_log; fla's KDA asserts an fp32 initial state); q, k, v, beta, dout are in the case's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs, grad_name

DEFAULT_SEED = 0
A_RANGE = (1.0, 16.0)
"""A = exp(A_log) is drawn in this range (the layers' ``uniform_(1, 16)``)."""
DT_RANGE = (1e-3, 0.1)
"""dt0 (softplus of dt_bias) is drawn log-uniform in this range (the layers' dt_min, dt_max)."""
GLA_NORMALIZER = 16.0
"""The linear kind's ``g = logsigmoid(a) / 16`` (fla's gate_logit_normalizer)."""


@dataclass(frozen=True, kw_only=True)
class RecurrenceInputs:
    """Tensors of one recurrence case (module doc for layouts and distributions); None where the kind has none."""

    q: torch.Tensor
    """Queries (Mamba2: C): (B, T, H, K), dtype."""
    k: torch.Tensor
    """Keys (Mamba2: B): (B, T, H, K), dtype."""
    v: torch.Tensor
    """Values (Mamba2: x): (B, T, HV, V), dtype."""
    dout: torch.Tensor
    """Upstream gradient of the output: (B, T, HV, V), dtype."""
    g: torch.Tensor | None = None
    """Log-decay, natural log: (B, T, HV) gdn/linear, (B, T, HV, K) kda; fp32. None for mamba2 and ungated."""
    beta: torch.Tensor | None = None
    """Delta-rule strength in (0, 1): (B, T, HV), dtype; gdn and kda."""
    dt: torch.Tensor | None = None
    """Mamba2's step, after softplus: (B, T, HV), fp32, positive."""
    A: torch.Tensor | None = None
    """Mamba2's decay rate per value head: (HV,), fp32, negative."""
    D: torch.Tensor | None = None
    """Mamba2's skip weight per value head: (HV,), fp32 (``spec.skip``)."""
    initial_state: torch.Tensor | None = None
    """State to start from: (N, HV, K, V), fp32 (``spec.initial_state``)."""
    dfinal_state: torch.Tensor | None = None
    """Upstream gradient of the final state: (N, HV, K, V), fp32 (fwd_bwd)."""
    A_log: torch.Tensor | None = None
    """The decay parameter g (or Mamba2's A) was made from: (HV,), fp32 (for kernels that form the decay themselves)."""
    dt_bias: torch.Tensor | None = None
    """The decay's bias: (HV,), or (HV·K,) for kda; fp32."""
    a: torch.Tensor | None = None
    """The decay's per-token pre-activation: shaped like g (Mamba2: like dt); fp32."""
    cu_seqlens: torch.Tensor | None = None
    """int64 (N+1,) offsets of each sequence in the packed tensors (varlen only)."""
    seed: int = DEFAULT_SEED
    """Seed the tensors were drawn with."""

    def tensor(self, name: str) -> torch.Tensor | None:
        """An input by name (``spec.input_names``)."""
        return getattr(self, name)


def make_inputs(spec: RecurrenceSpec, *, seed: int = DEFAULT_SEED, device: str | torch.device = "cpu"
                ) -> RecurrenceInputs:
    """Draw the inputs of ``spec`` from ``seed`` on ``device`` (module doc)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    nb, t = (1, spec.total_tokens) if spec.is_varlen else (spec.num_seqs, spec.seqlens[0])
    h, hv, dk, dv = spec.heads_qk, spec.heads_v, spec.d_k, spec.d_v

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    # q, k, v, dout and the states are drawn where they are used: on a GPU, with its own generator, in fp32 (at 128k
    # tokens and 64 value heads v and dout are 1e9 numbers each, a minute to draw in fp64 on the host)
    on_host = torch.device(device).type == "cpu"
    tokens_gen = gen if on_host else torch.Generator(device=device).manual_seed(seed)

    def tokens(*shape):
        return torch.randn(*shape, generator=tokens_gen, device=device,
                           dtype=torch.float64 if on_host else torch.float32)

    q, k, v, dout = tokens(nb, t, h, dk), tokens(nb, t, h, dk), tokens(nb, t, hv, dv), tokens(nb, t, hv, dv)
    if spec.delta and not spec.l2norm:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    fields: dict = {}
    if spec.kind == "linear":
        if spec.gated:
            fields["a"] = normal(nb, t, hv)
            fields["g"] = F.logsigmoid(fields["a"]) / GLA_NORMALIZER
    else:
        gate_shape = (nb, t, hv, dk) if spec.per_channel else (nb, t, hv)
        a_log, dt_bias = decay_parameters(hv, hv * dk if spec.per_channel else hv, gen)
        a = normal(*gate_shape)
        step = F.softplus(a + dt_bias.view(hv, dk) if spec.per_channel else a + dt_bias)
        fields.update(A_log=a_log, dt_bias=dt_bias, a=a)
        if spec.kind == "mamba2":
            fields.update(dt=step, A=-torch.exp(a_log))
            if spec.skip:
                fields["D"] = 0.5 + torch.rand(hv, generator=gen, dtype=torch.float64)
        elif spec.decay_bound is not None:  # kda's bounded decay LB · sigmoid(exp(A_log) · (a + dt_bias)), dt_bias = 0
            fields["dt_bias"] = torch.zeros_like(dt_bias)
            fields["g"] = spec.decay_bound * torch.sigmoid(torch.exp(a_log).view(hv, 1) * a)
        elif spec.gated:
            fields["g"] = -torch.exp(a_log).view(hv, *([1] if spec.per_channel else [])) * step
        else:
            del fields["A_log"], fields["dt_bias"], fields["a"]
    if spec.delta:
        fields["beta"] = torch.sigmoid(normal(nb, t, hv))
    if spec.initial_state:
        fields["initial_state"] = tokens(*spec.state_shape)  # (N, HV, K, V): 2 GiB of fp64 at a decode batch of 256
    fields["dfinal_state"] = tokens(*spec.state_shape)
    cu = None
    if spec.is_varlen:
        cu = torch.tensor([0, *_cumsum(spec.sequences)], dtype=torch.int64, device=device)
    token_dtype = {"q", "k", "v", "dout", "beta"}
    tensors = {name: value.to(device=device, dtype=spec.torch_dtype if name in token_dtype else torch.float32)
               for name, value in dict(q=q, k=k, v=v, dout=dout, **fields).items()}
    return RecurrenceInputs(**tensors, cu_seqlens=cu, seed=seed)


def decay_parameters(heads: int, biases: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log (heads,), dt_bias (biases,)) in fp64 as the layers initialise them (module doc): A = exp(A_log) in
    A_RANGE and softplus(dt_bias) log-uniform in DT_RANGE, both stratified. The e2e hybrid model's GDN layers take
    theirs from here too, so that its decays span the same range as the operator's cases."""
    a_log = torch.log(_stratified(A_RANGE, heads, gen, log=False))
    dt0 = _stratified(DT_RANGE, biases, gen, log=True)
    return a_log, dt0 + torch.log(-torch.expm1(-dt0))  # softplus⁻¹


def expected_shapes(spec: RecurrenceSpec) -> dict[str, tuple[int, ...]]:
    """The shape of every input ``spec`` has, by name (module doc for the layouts)."""
    nb, t = (1, spec.total_tokens) if spec.is_varlen else (spec.num_seqs, spec.seqlens[0])
    h, hv, dk, dv = spec.heads_qk, spec.heads_v, spec.d_k, spec.d_v
    shapes = {"q": (nb, t, h, dk), "k": (nb, t, h, dk), "v": (nb, t, hv, dv), "dout": (nb, t, hv, dv),
              "g": (nb, t, hv, dk) if spec.per_channel else (nb, t, hv), "beta": (nb, t, hv), "dt": (nb, t, hv),
              "A": (hv,), "D": (hv,), "initial_state": spec.state_shape, "dfinal_state": spec.state_shape}
    return {name: shapes[name] for name in (*spec.input_names, "dout", "dfinal_state")}


def validate(spec: RecurrenceSpec, inputs: RecurrenceInputs) -> None:
    """Raise a one-line ValueError when ``inputs`` do not fit ``spec`` (a missing tensor, a wrong shape, offsets
    that do not match the sequences)."""
    for name, shape in expected_shapes(spec).items():
        got = inputs.tensor(name)
        if got is None:
            raise ValueError(f"the case needs {name} {shape} but the inputs have none")
        if tuple(got.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(got.shape)} but the case needs {shape}"
                             + (" = (N, HV, K, V)" if name.endswith("state") else ""))
    if spec.is_varlen:
        want = [0, *_cumsum(spec.sequences)]
        if inputs.cu_seqlens is None or inputs.cu_seqlens.tolist() != want:
            got = None if inputs.cu_seqlens is None else inputs.cu_seqlens.tolist()
            raise ValueError(f"cu_seqlens is {got} but the case's sequences need {want}")


def _stratified(bounds: tuple[float, float], n: int, gen: torch.Generator, *, log: bool) -> torch.Tensor:
    """n fp64 values in ``bounds``, one from each 1/n quantile (uniform, or log-uniform), in shuffled order."""
    u = (torch.randperm(n, generator=gen).double() + torch.rand(n, generator=gen, dtype=torch.float64)) / n
    lo, hi = bounds
    if log:
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return lo + u * (hi - lo)


def _cumsum(values) -> list[int]:
    out, total = [], 0
    for value in values:
        total += value
        out.append(total)
    return out


def pad_sequences(spec: RecurrenceSpec, x: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) in the input layout -> (N, T_max, ...), one row per sequence, zeros after each end.

    A zero token leaves every kind's state as it is (decay exp(0) = 1, k = 0 adds nothing, beta = 0 and
    dt = 0 update nothing), so a recurrence over the padded rows is exact for each sequence."""
    if not spec.is_varlen:
        return x
    longest = max(spec.sequences)
    rows, start = [], 0
    for length in spec.sequences:
        part = x[0, start:start + length]
        rows.append(F.pad(part, (0, 0) * (part.dim() - 1) + (0, longest - length)))
        start += length
    return torch.stack(rows)


def unpad_sequences(spec: RecurrenceSpec, x: torch.Tensor) -> torch.Tensor:
    """(N, T_max, ...) -> the input layout: (B, T, ...) dense, (1, total, ...) varlen (the inverse of padding)."""
    if not spec.is_varlen:
        return x
    return torch.cat([x[i, :length] for i, length in enumerate(spec.sequences)])[None]


FP32_INPUTS = ("g", "dt", "A", "D", "initial_state")
"""Inputs every kernel library keeps in fp32 whatever the case's dtype (the decays, Mamba2's step and skip, the
state): a form "in the case's dtype" takes them in fp32 as well (``with_gradients``' ``gates``)."""


def with_gradients(spec: RecurrenceSpec, inputs: RecurrenceInputs, forward, *, dtype: torch.dtype | None = None,
                   device: str | torch.device | None = None, gates: torch.dtype | None = None) -> Outputs:
    """``forward(leaves) -> (out, final_state)`` on the case's inputs as autograd leaves (``spec.input_names``, moved
    to ``device`` and cast to ``dtype`` where given, those of ``FP32_INPUTS`` to ``gates`` where that is given), as
    Outputs; with ``fwd_bwd`` also the gradient of every input against ``dout`` (cast like the tokens) and
    ``dfinal_state`` (like the state), zeros for an input the outputs do not use."""
    grads = spec.pass_ == "fwd_bwd"

    def cast(name: str) -> torch.dtype | None:
        return gates if gates is not None and name in FP32_INPUTS else dtype
    leaves = {name: inputs.tensor(name).detach().to(device=device, dtype=cast(name)).requires_grad_(grads)
              for name in spec.input_names}
    with torch.enable_grad() if grads else torch.no_grad():
        out, state = forward(leaves)
    result = Outputs(out=out.detach(), final_state=state.detach())
    if grads:
        ups = (inputs.dout.to(device=device, dtype=dtype),
               inputs.dfinal_state.to(device=device, dtype=cast("initial_state")))
        got = torch.autograd.grad((out, state), list(leaves.values()), ups, allow_unused=True)
        for name, leaf, grad in zip(leaves, leaves.values(), got):
            result[grad_name(name)] = torch.zeros_like(leaf) if grad is None else grad
    return result


def kernel_closure(spec: RecurrenceSpec, inputs: RecurrenceInputs, refusal: str | None, make_call):
    """What a kernel library's ``prepare`` returns: the inputs checked against ``spec`` (``validate``) and the
    library's own ``refusal`` raised (ValueError), then ``make_call()`` (where the library is imported) and a
    closure running ``call(leaves, cu_seqlens)`` on the inputs as autograd leaves (``with_gradients``)."""
    validate(spec, inputs)
    if refusal is not None:
        raise ValueError(refusal)
    call = make_call()
    return lambda: with_gradients(spec, inputs, lambda leaves: call(leaves, inputs.cu_seqlens))

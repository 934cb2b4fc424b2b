"""FLOPs and bytes of a recurrence case: the convention, written down once.

**What is counted.** Multiply-adds count 2, an elementwise multiply 1; exponentials, L2 norms, sigmoid and the
gates' own arithmetic are not counted (as attention's convention leaves out the softmax). Everything is per
value head, summed over heads and sequences; K = d_k, V = d_v.

**Recurrent form** (``form="recurrent"``: one token at a time, what ``fused_recurrent_*`` and decode kernels do),
per token, on the (K, V) state:

    decay            exp(g)·S                    K·V     (gated kinds)
    delta read       Sᵀk                        2·K·V   (gdn, kda)
    update           S + k uᵀ                   2·K·V
    output           Sᵀq                        2·K·V

so gdn/kda 7·K·V, linear and mamba2 5·K·V, less K·V without gating. The state is touched every token: the
recurrent form is bound by reading and writing it, and its FLOPs are small.

**Chunked form** (``form="chunked"``: what ``chunk_*`` kernels compute), per chunk of c tokens (the last chunk
of a sequence is shorter; each sequence is chunked on its own), with the intra-chunk products counted over the
(i, j) pairs the causal chunk keeps, as attention's ``exact`` convention counts attended pairs:

    Q Kᵀ ⊙ Γ, then (·) U     c(c+1)/2 pairs (j ≤ i)  × 2·(K + V)
    Q S₀ (read the state)     2·c·K·V
    Kᵀ U (write the state)    2·c·K·V,  plus the state's decay K·V once a chunk (gated kinds)
    delta rule only:
      K Kᵀ ⊙ Γ                c(c−1)/2 pairs (j < i) × 2·K
      the triangular solve    c(c−1)/2 × 2·(K + V)   (forward substitution on [V | exp(γ)K])
      W S₀                    2·c·K·V

Per token this is about (c + 1)·(K + V) for the intra-chunk products (plus (c − 1)·(2K + V) with the delta rule)
and 4·K·V (6·K·V with the delta rule) for the state passing: for GDN with c = 64 and K = V = 128, about 41k and
98k FLOPs a token and head (139k in all), a fifth more than the recurrent form's 7·K·V = 115k.
KDA's per-channel decay makes the intra-chunk products elementwise-weighted sums with the same count.

**Backward** = 2 × forward (each forward product has two operand gradients of its own size), so fwd_bwd is
3 × forward. Recomputation is not counted: a kernel that recomputes states in its backward (fla's chunk kernels
do) does more work than counted and shows a lower rate for it.

**Bytes** are the minimal traffic: the forward reads q, k, v, the gates, beta and the initial state, and writes
the output and the final state; the backward reads all of those plus dout and the final state's gradient and
writes one gradient per input. Each tensor counts at its own element size (``inputs``: q, k, v, beta, output in
the case's dtype; gates and states fp32). Per-chunk states a chunk kernel materialises are not counted.
``state_bytes`` is the state read and written once, the figure a decode step is judged by.
"""

from __future__ import annotations

from attnbench.linear.spec import RecurrenceSpec

FORMS = ("chunked", "recurrent")
PASS_FLOP_FACTOR = {"fwd": 1.0, "fwd_bwd": 3.0}
GATE_BYTES = 4
"""Gates (g, dt, A, D) and states are fp32."""


def recurrent_flops_per_token(spec: RecurrenceSpec) -> int:
    """Forward FLOPs of one token and one value head in the recurrent form (module doc)."""
    kv = spec.d_k * spec.d_v
    return kv * ((1 if spec.gated else 0) + (2 if spec.delta else 0) + 2 + 2)


def chunk_flops(spec: RecurrenceSpec, c: int) -> int:
    """Forward FLOPs of one chunk of ``c`` tokens and one value head in the chunked form (module doc)."""
    dk, dv = spec.d_k, spec.d_v
    kept, before = c * (c + 1) // 2, c * (c - 1) // 2
    total = kept * 2 * (dk + dv) + 2 * c * dk * dv + 2 * c * dk * dv + (dk * dv if spec.gated else 0)
    if spec.delta:
        total += before * 2 * dk + before * 2 * (dk + dv) + 2 * c * dk * dv
    return total


def flops(spec: RecurrenceSpec, form: str = "chunked", pass_: str | None = None) -> float:
    """Floating-point operations of one call of ``pass_`` (default the spec's) in ``form``."""
    if form not in FORMS:
        raise ValueError(f"unknown recurrence form {form!r}; allowed: {', '.join(FORMS)}")
    pass_ = pass_ or spec.pass_
    if form == "recurrent":
        fwd = recurrent_flops_per_token(spec) * spec.total_tokens
    else:
        fwd = 0
        for length in spec.sequences:
            whole, rest = divmod(length, spec.chunk)
            fwd += whole * chunk_flops(spec, spec.chunk) + (chunk_flops(spec, rest) if rest else 0)
    return float(fwd * spec.heads_v * PASS_FLOP_FACTOR[pass_])


def state_bytes(spec: RecurrenceSpec) -> int:
    """Bytes of every sequence's state (N, HV, K, V) in fp32, read once and written once."""
    n, hv, dk, dv = spec.state_shape
    return 2 * n * hv * dk * dv * GATE_BYTES


def bytes_moved(spec: RecurrenceSpec, pass_: str | None = None) -> float:
    """Minimal bytes read and written by one call of ``pass_`` (module doc); the same for either form."""
    pass_ = pass_ or spec.pass_
    elem = spec.torch_dtype.itemsize
    t, h, hv, dk, dv = spec.total_tokens, spec.heads_qk, spec.heads_v, spec.d_k, spec.d_v
    qk = 2 * t * h * dk * elem
    v = o = t * hv * dv * elem
    if spec.kind == "mamba2":
        gates = t * hv * GATE_BYTES + hv * GATE_BYTES * (2 if spec.skip else 1)  # dt; A (and D)
    elif spec.gated:
        gates = t * hv * (dk if spec.per_channel else 1) * GATE_BYTES
    else:
        gates = 0
    beta = t * hv * elem if spec.delta else 0
    state = spec.num_seqs * hv * dk * dv * GATE_BYTES
    inputs = qk + v + gates + beta + (state if spec.initial_state else 0)
    fwd = inputs + o + state
    bwd = (inputs + o + state) + inputs  # read the inputs, dout and the final state's gradient; write gradients
    return float({"fwd": fwd, "fwd_bwd": fwd + bwd}[pass_])

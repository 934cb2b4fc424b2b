"""One linear-attention / recurrent-layer problem: a frozen, validated description per case.

Four kinds share one state recurrence (``attnbench.linear.reference`` writes it out): per sequence and value head
``hv`` a state ``S`` of shape (d_k, d_v), decayed, updated with the token's key and value, and read by the query.

- ``gdn``: Gated DeltaNet (Qwen3-Next, Qwen3.5), a scalar log-decay ``g`` per token and value head and the delta
  rule with strength ``beta``; ``gated=False`` is plain DeltaNet (no decay).
- ``kda``: Kimi Delta Attention (Kimi Linear), the delta rule with a per-channel log-decay ``g`` of d_k values.
- ``mamba2``: Mamba2's SSD, a scalar decay ``exp(A·dt)`` per head; C, B and x take the places of q, k and v, the
  input enters as ``dt·x``, no 1/sqrt(d_k) scale, and with ``skip`` the output adds ``D·x``.
- ``linear``: (gated) linear attention, a scalar log-decay per head (fla's simple GLA); ``gated=False`` is plain
  linear attention.

Heads: q and k have ``heads_qk`` heads, v, the gates, the output and the state ``heads_v`` (a multiple); value
head ``hv`` reads q/k head ``hv // (heads_v // heads_qk)`` (fla's GVA, ``fused_recurrent.py:70``).

Sequences follow ``attnbench.spec``: one length is a dense case of ``batch`` sequences, (B, T, H, D); several
lengths are a varlen group repeated ``batch`` times, packed into (1, total, H, D) with ``cu_seqlens`` as fla takes
them. ``decode`` is one new token per sequence, continuing from a state handed in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from attnbench.serving import describe
from attnbench.spec import DTYPES, FP8_DTYPES, LABEL_SEQUENCES, normalize_dtype

KINDS = ("gdn", "kda", "mamba2", "linear")
PASSES = ("fwd", "fwd_bwd")
MAX_HEAD_DIM = 1024
"""Largest d_k / d_v accepted (models use 64..256)."""
DEFAULT_SEQLEN = 2048
"""Tokens per sequence when no lengths are given (prefill); decode gives each sequence one."""
DEFAULT_CHUNK = 64
"""Tokens per chunk when none is given (fla's default)."""
DELTA_KINDS = ("gdn", "kda")
"""Kinds with the delta rule (and so a ``beta``)."""
UNGATED_KINDS = ("gdn", "linear")
"""Kinds that can run without a decay (``gated=False``): DeltaNet and plain linear attention."""


@dataclass(frozen=True, kw_only=True)
class RecurrenceSpec:
    """One recurrence problem: kind, shapes, dtype, the pass and how the state starts."""

    kind: str = "gdn"
    """Which recurrence: gdn, kda, mamba2 or linear (module doc)."""
    batch: int = 1
    """Dense: number of sequences. Varlen: how many times the group of ``seqlens`` is repeated."""
    seqlens: tuple[int, ...] | None = None
    """Tokens of each sequence; several values make a varlen case. None: 1 for decode, else DEFAULT_SEQLEN."""
    heads_qk: int = 16
    """Heads of q and k (Mamba2: groups of C and B)."""
    heads_v: int | None = None
    """Heads of v, gates, output and state, a multiple of ``heads_qk``; None = ``heads_qk``."""
    d_k: int = 128
    """Head size of q and k (Mamba2: the state size N), the state's rows."""
    d_v: int | None = None
    """Head size of v and the output (Mamba2: the head dim P), the state's columns; None = ``d_k``."""
    dtype: str = "bf16"
    """Element type of q, k, v, beta and the output: fp16, bf16, fp32 or fp64 (gates and state: fp32)."""
    pass_: str = "fwd"
    """Which pass is timed: fwd or fwd_bwd."""
    decode: bool = False
    """One new token per sequence, continuing from a state handed in (``initial_state`` on)."""
    initial_state: bool | None = None
    """A state (N, heads_v, d_k, d_v) to start from; None = on for decode, off otherwise."""
    l2norm: bool | None = None
    """q and k L2-normalised per head inside the op (fla's ``use_qk_l2norm_in_kernel``); None = on for gdn and
    kda (as their layers call it), off for mamba2 and linear."""
    chunk: int = DEFAULT_CHUNK
    """Tokens per chunk of the chunked forms (fla's default 64; the recurrent forms ignore it)."""
    scale: float | None = None
    """Factor on the output ``S_tᵀ q_t``; None = 1/sqrt(d_k), or 1 for mamba2."""
    gated: bool = True
    """A decay on the state; False (gdn, linear only) gives DeltaNet / plain linear attention."""
    skip: bool = False
    """mamba2 only: the output adds ``D·x``, D one value per value head."""
    decay_bound: float | None = None
    """kda only: the bounded decay ``decay_bound · sigmoid(exp(A_log) · (a + dt_bias))``, log-decays in
    [decay_bound, 0) (fla's ``chunk_kda(safe_gate=True, lower_bound=...)``; cuDNN's sm90 KDA was verified with -5),
    drawn with dt_bias = 0 so that the mean log-decay is decay_bound / 2 (-2.5 at -5, the regime cuDNN's notes
    describe); None = Kimi Linear's unbounded ``-exp(A_log) · softplus(a + dt_bias)``."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.seqlens is None:
            set_(self, "seqlens", (1,) if self.decode else (DEFAULT_SEQLEN,))
        set_(self, "seqlens", _lengths(self.seqlens))
        if self.heads_v is None:
            set_(self, "heads_v", self.heads_qk)
        if self.d_v is None:
            set_(self, "d_v", self.d_k)
        if self.initial_state is None:
            set_(self, "initial_state", bool(self.decode))
        if self.l2norm is None:
            set_(self, "l2norm", self.kind in DELTA_KINDS)
        set_(self, "dtype", normalize_dtype(self.dtype))
        self._validate()

    def _validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown recurrence kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        for name in ("batch", "heads_qk", "heads_v", "chunk"):
            _positive(name, getattr(self, name))
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HEAD_DIM:
                raise ValueError(f"{name} must be an integer in 1..{MAX_HEAD_DIM}, got {value!r}")
        if self.heads_v % self.heads_qk:
            raise ValueError(f"value heads ({self.heads_v}) must be a multiple of q/k heads ({self.heads_qk}): "
                             "value head hv reads q/k head hv // (heads_v / heads_qk)")
        if self.dtype in FP8_DTYPES:
            raise ValueError(f"recurrences take fp16, bf16, fp32 or fp64 inputs, got {self.dtype}")
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r} for a recurrence; allowed: {', '.join(PASSES)}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale!r}")
        if self.decode and set(self.seqlens) != {1}:
            raise ValueError(f"decode takes one new token per sequence: seqlens must all be 1 (or unset), "
                             f"got {self.seqlens}")
        if self.decode and not self.initial_state:
            raise ValueError("decode continues from a state: initial_state must be on (or unset)")
        if self.kind == "mamba2" and self.l2norm:
            raise ValueError("mamba2 uses its B and C as they are: leave l2norm off (or unset)")
        if not self.gated and self.kind not in UNGATED_KINDS:
            raise ValueError(f"{self.kind} always has its decay (gated=False is for gdn = DeltaNet and linear)")
        if self.skip and self.kind != "mamba2":
            raise ValueError("skip (the D·x term) belongs to mamba2; leave it off for " + self.kind)
        if self.decay_bound is not None:
            if self.kind != "kda":
                raise ValueError(f"decay_bound (the bounded decay) belongs to kda, not {self.kind}")
            if isinstance(self.decay_bound, bool) or not isinstance(self.decay_bound, (int, float)) \
                    or not -1e3 <= self.decay_bound < 0:
                raise ValueError(f"decay_bound is the lowest log-decay, a negative number (e.g. -5), "
                                 f"got {self.decay_bound!r}")

    # ---- derived ------------------------------------------------------------------------------------
    @property
    def sequences(self) -> tuple[int, ...]:
        """Length of every sequence, batch repetitions included (N values)."""
        return self.seqlens * self.batch

    @property
    def num_seqs(self) -> int:
        """N: sequences (and states) of the case."""
        return len(self.seqlens) * self.batch

    @property
    def total_tokens(self) -> int:
        """Tokens of all sequences."""
        return sum(self.sequences)

    @property
    def is_varlen(self) -> bool:
        """Several lengths: inputs are packed (1, total, H, D) with ``cu_seqlens``."""
        return len(self.seqlens) > 1

    @property
    def group(self) -> int:
        """Value heads per q/k head."""
        return self.heads_v // self.heads_qk

    @property
    def qk_scale(self) -> float:
        """The factor on ``S_tᵀ q_t``."""
        if self.scale is not None:
            return float(self.scale)
        return 1.0 if self.kind == "mamba2" else self.d_k ** -0.5

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def delta(self) -> bool:
        """The delta rule (gdn, kda): the state first forgets what it holds for k_t, with strength beta."""
        return self.kind in DELTA_KINDS

    @property
    def per_channel(self) -> bool:
        """A decay per key channel (kda) rather than per head."""
        return self.kind == "kda"

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """(N, heads_v, d_k, d_v): fla's layout of the initial and final state."""
        return (self.num_seqs, self.heads_v, self.d_k, self.d_v)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The differentiable inputs, in order; each has a gradient ``d<name>``."""
        names = ["q", "k", "v"]
        if self.kind == "mamba2":
            names += ["dt", "A"] + (["D"] if self.skip else [])
        elif self.gated:
            names.append("g")
        if self.delta:
            names.append("beta")
        if self.initial_state:
            names.append("initial_state")
        return tuple(names)

    operator: ClassVar[str] = "recurrence"
    """``attnbench.operators``: the pipeline asks it for inputs, FLOPs, bytes, store columns and the check."""

    def to_dict(self) -> dict:
        """Plain JSON-able fields, with the operator's name (``operators.spec_from_dict`` reads it back)."""
        out = {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
               for f in dataclasses.fields(self)}
        return {"operator": self.operator, **out}

    @classmethod
    def from_dict(cls, data: dict) -> RecurrenceSpec:
        data = {k: v for k, v in data.items() if k != "operator"}
        if data.get("seqlens") is not None:
            data["seqlens"] = tuple(data["seqlens"])
        return cls(**data)

    def shape_key(self) -> tuple:
        """Everything that decides the input tensors (not the pass): cases sharing it share inputs."""
        return ("recurrence", *dataclasses.astuple(self.replace(pass_="fwd")))

    def replace(self, **changes) -> RecurrenceSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def label(self) -> str:
        """Short human label, e.g. ``gdn b2 s4096 h16/32 k128 v128 bf16 l2`` (the pass is not in it: records and
        progress lines show it beside the label, as for attention)."""
        if len(self.seqlens) > LABEL_SEQUENCES:
            seq = "reqs[" + describe(self.seqlens, self.seqlens) + "]"
        elif self.is_varlen:
            seq = "varlen[" + ",".join(map(str, self.seqlens)) + "]"
        else:
            seq = f"s{self.seqlens[0]}"
        heads = f"h{self.heads_qk}" + (f"/{self.heads_v}" if self.heads_v != self.heads_qk else "")
        parts = [self.kind if self.gated else f"{self.kind}-ungated", f"b{self.batch}", seq, heads,
                 f"k{self.d_k}", f"v{self.d_v}", self.dtype]
        if self.decode:
            parts.append("decode")
        elif self.initial_state:
            parts.append("h0")
        if self.l2norm:
            parts.append("l2")
        if self.skip:
            parts.append("D")
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        if self.chunk != 64:
            parts.append(f"c{self.chunk}")
        if self.decay_bound is not None:
            parts.append(f"lb{self.decay_bound:g}")
        return " ".join(parts)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _lengths(values) -> tuple[int, ...]:
    values = (values,) if isinstance(values, int) else tuple(values)
    if not values:
        raise ValueError("seqlens is empty; give at least one sequence length")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"sequence lengths must be positive integers, got {v!r} in seqlens")
    return values

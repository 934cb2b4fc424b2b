"""One index-selected MLA case (DeepSeek sparse attention): a frozen, validated description, and its seeded inputs.

``batch`` requests, each with ``s_q`` queries (the last ``s_q`` tokens of its ``s_kv``-token sequence, lower-right
aligned as the project's causal cases) over its own cache of ``s_kv`` MLA rows (576 wide: 512 latent + 64 rope, one
KV head; the value is the latent part). Every query attends ``topk`` slots of its request's cache, chosen by
``indices`` (``indices.PATTERNS``: the lightning indexer's top-k over seeded indexer inputs, random keys, the prefix
or a sliding window). The requests' caches are stacked into one (batch · s_kv, 576) cache, each request's slots
naming rows of its own block, as FlashMLA's kernels take them.

Options of the case: ``sink`` (a per-head attention-sink logit, V4), ``topk_length`` (a per-query count of slots
that count — one per request in decode, FlashMLA's ``topk_length``), ``extra`` = (rows, topk) (V4's second,
compressed cache with index lists of its own, per request), and ``decode``: the cache is V3.2's FP8 layout (656
bytes a row, ``fp8.py``), the exact reference computes over its dequantized rows, the values a kernel reads.

**Slot kinds.** An index list holds −1 where its query sees fewer keys than top-k, and nowhere else: a kernel that
reads −1 as row 0, or an index past the cache as a row, would pass every case whose queries all see top-k keys.
So ``invalid`` empties a fraction of the filled slots anywhere in the list (not only at its end): half −1 and half
an index past the cache in prefill (FlashMLA's prefill contract: "set to -1 or numbers >= s_kv"), all −1 in decode
(its FP8 decode reads any other index as a page address). ``repeats`` overwrites a fraction of the slots with
another slot's row of the same query: a row named twice counts twice (``reference.py``); a kernel that cannot take
it says so (``flex-sparse-mla``: a mask names a key once). Both are drawn from a generator of their own, so the
other tensors of the case are the same with them or without them, and both are left out of the stored case when 0,
so that the ids of cases without them did not change. ``sweep`` draws ``INVALID_RATE`` empty slots unless told
otherwise; repeats only when asked (``--repeated-slots``) and in ``verify``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from attnbench.outputs import Outputs
from attnbench.sparse.indices import DEEPSEEK_SCALE, PATTERNS, make_indices
from attnbench.sparse.reference import LATENT, ROPE, Selection
from attnbench.spec import normalize_dtype

DTYPES = ("fp16", "bf16", "fp32")
PASSES = ("fwd", "fwd_bwd")
LENGTHS_SEED = 1234
"""``topk_length``'s lengths come from this seed, not the run's: they define the case (its FLOPs count them)."""
SLOTS_SEED = 4321
"""Offset of the generator of empty and repeated slots from the run's seed (module doc)."""
INVALID_RATE = 1 / 64
"""Fraction of filled slots a run's cases empty by default: 32 of V3.2's 2048 per query, 2 of a CPU case's 128."""
OMITTED_WHEN_ZERO = ("invalid", "repeats")
"""Fields a stored case leaves out at 0: cases without them keep the ids they had before the fields existed."""


@dataclass(frozen=True, kw_only=True)
class SparseSpec:
    """One index-selected MLA problem (module doc)."""

    batch: int = 1
    """Requests, each with its own cache."""
    s_q: int = 4096
    """Queries per request (prefill: its new tokens; decode: 1-2)."""
    s_kv: int = 8192
    """Cache rows per request."""
    heads: int = 128
    """Query heads (FlashMLA: 64 or 128)."""
    topk: int = 2048
    """Slots per query (DeepSeek-V3.2: 2048)."""
    indices: str = "indexer"
    """How the slots are chosen: ``indices.PATTERNS``."""
    d_qk: int = LATENT + ROPE
    """Row width (576)."""
    d_v: int = LATENT
    """Value width: the first d_v values of a row (512)."""
    dtype: str = "bf16"
    """Element type of q, the cache, out and the gradients (decode: the cache is FP8 rows)."""
    pass_: str = "fwd"
    """fwd or fwd_bwd."""
    decode: bool = False
    """The cache as V3.2's FP8 rows (656 bytes), paged, as FlashMLA's sparse decode reads it."""
    sink: bool = False
    """A per-head attention-sink logit (V4)."""
    topk_length: bool = False
    """Only the first lengths[t] slots of each query count (lengths drawn from ``LENGTHS_SEED``)."""
    extra: tuple[int, int] | None = None
    """(rows, topk) of V4's extra cache per request, with random index lists of its own; None: none."""
    scale: float = DEEPSEEK_SCALE
    """Softmax scale (DeepSeek-V3: 192^-½)."""
    invalid: float = 0.0
    """Fraction of filled slots made empty, anywhere in a list: −1 or past the cache (decode: −1) (module doc)."""
    repeats: float = 0.0
    """Fraction of slots overwritten with another slot's row of the same query (module doc)."""

    operator: ClassVar[str] = "sparse-mla"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if self.extra is not None:
            object.__setattr__(self, "extra", tuple(self.extra))
        for name in ("batch", "s_q", "s_kv", "heads", "topk", "d_qk", "d_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.s_q > self.s_kv:
            raise ValueError(f"{self.s_q} queries per request are more than its {self.s_kv} cache rows: the queries "
                             "are the last s_q tokens of the sequence")
        if self.topk > self.s_kv:
            raise ValueError(f"top-k {self.topk} is more than the {self.s_kv} cache rows of a request")
        if self.indices not in PATTERNS:
            raise ValueError(f"unknown --indices {self.indices!r}; allowed: {', '.join(PATTERNS)}")
        if self.d_v > self.d_qk:
            raise ValueError(f"d_v {self.d_v} is wider than the row ({self.d_qk})")
        if self.dtype not in DTYPES:
            raise ValueError(f"sparse MLA takes {', '.join(DTYPES)}, not {self.dtype}")
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r} for sparse MLA; allowed: {', '.join(PASSES)}")
        if self.decode and (self.dtype != "bf16" or self.d_qk != LATENT + ROPE):
            raise ValueError("the FP8 decode cache is V3.2's layout: bf16 rows of 576 quantized to 656 bytes")
        if self.extra is not None and (len(self.extra) != 2 or any(not isinstance(x, int) or x < 1 for x in self.extra)):
            raise ValueError(f"extra is (rows, topk) of positive integers, got {self.extra!r}")
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number, got {self.scale!r}")
        for name in OMITTED_WHEN_ZERO:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name} is a fraction of the slots in [0, 1), got {value!r}")

    @property
    def queries(self) -> int:
        return self.batch * self.s_q

    @property
    def cache_rows(self) -> int:
        return self.batch * self.s_kv

    def replace(self, **changes) -> SparseSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        out = {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
               for f in dataclasses.fields(self) if not (f.name in OMITTED_WHEN_ZERO and not getattr(self, f.name))}
        return {"operator": self.operator, **out}

    @classmethod
    def from_dict(cls, data: dict) -> SparseSpec:
        data = {k: v for k, v in data.items() if k != "operator"}
        if data.get("extra") is not None:
            data["extra"] = tuple(data["extra"])
        return cls(**data)

    def shape_key(self) -> tuple:
        return ("sparse-mla", *dataclasses.astuple(self.replace(pass_="fwd")))

    def label(self) -> str:
        """e.g. ``sparse-mla b1 q4096 kv8192 h128 top2048 indexer bf16`` (the pass beside it, as for attention)."""
        parts = ["sparse-mla", f"b{self.batch}", f"q{self.s_q}", f"kv{self.s_kv}", f"h{self.heads}",
                 f"top{self.topk}", self.indices, "fp8-cache" if self.decode else self.dtype]
        if self.d_qk != LATENT + ROPE or self.d_v != LATENT:
            parts.append(f"d{self.d_qk}/{self.d_v}")
        if self.sink:
            parts.append("sink")
        if self.topk_length:
            parts.append("lengths")
        if self.extra is not None:
            parts.append(f"extra{self.extra[0]}x{self.extra[1]}")
        if self.invalid:
            parts.append(f"empty{self.invalid:.3g}")
        if self.repeats:
            parts.append(f"repeat{self.repeats:.3g}")
        return " ".join(parts)

    def lengths(self, device=None) -> torch.Tensor | None:
        """(queries,) int32 slot counts (``topk_length``), one per request in decode; None when off."""
        if not self.topk_length:
            return None
        gen = torch.Generator().manual_seed(LENGTHS_SEED)
        per = self.batch if self.decode else self.queries
        n = torch.randint(1, self.topk + 1, (per,), generator=gen, dtype=torch.int32)
        if self.decode:
            n = n.repeat_interleave(self.s_q)
        return n.to(device)


@dataclass(frozen=True, kw_only=True)
class SparseInputs:
    """Seeded tensors of a case. ``kv`` is what the reference and the PyTorch forms read (the dequantized FP8 rows
    in decode); ``rows`` the FP8 bytes a decode kernel reads."""

    q: torch.Tensor
    kv: torch.Tensor
    selection: Selection
    dout: torch.Tensor
    attn_sink: torch.Tensor | None = None
    extra_kv: torch.Tensor | None = None
    extra: Selection | None = None
    rows: torch.Tensor | None = None
    extra_rows: torch.Tensor | None = None
    seed: int = 0

    def kwargs(self, spec: SparseSpec) -> dict:
        """Keyword arguments of ``reference_sparse`` / ``baseline_sparse`` besides q, kv and the selection."""
        return dict(scale=spec.scale, d_v=spec.d_v, attn_sink=self.attn_sink, extra_kv=self.extra_kv,
                    extra=self.extra)


def make_inputs(spec: SparseSpec, device="cpu", seed: int = 0) -> SparseInputs:
    """Draw a case's inputs: per request its queries, cache and index lists (``indices.make_indices``, offset to the
    request's block of the stacked cache); then the sink, the extra cache and dout. On a GPU the index lists are
    drawn there (the indexer's logits are a GEMM)."""
    from attnbench.sparse import fp8
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    q = torch.randn(spec.queries, spec.heads, spec.d_qk, generator=gen, device=device).to(dt)
    kv = torch.randn(spec.cache_rows, spec.d_qk, generator=gen, device=device).to(dt)
    lists = []
    for r in range(spec.batch):
        idx = make_indices(spec.indices, spec.s_q, spec.s_kv, spec.topk, generator=gen, device=device)
        lists.append(torch.where(idx >= 0, idx + r * spec.s_kv, idx))
    slots = torch.Generator(device=device).manual_seed(seed + SLOTS_SEED)  # module doc: "Slot kinds"
    selection = Selection(indices=_slot_kinds(spec, torch.cat(lists).to(torch.int32), spec.cache_rows, slots),
                          lengths=spec.lengths(device))
    extra_kv = extra = None
    if spec.extra is not None:
        rows, width = spec.extra
        extra_kv = torch.randn(spec.batch * rows, spec.d_qk, generator=gen, device=device).to(dt)
        # distinct rows of the request's extra cache, in random order
        own = torch.rand(spec.queries, rows, generator=gen, device=device).argsort(dim=-1)[:, :width].to(torch.int32)
        base = (torch.arange(spec.queries, device=device) // spec.s_q * rows).to(torch.int32)[:, None]
        extra = Selection(indices=_slot_kinds(spec, own + base, spec.batch * rows, slots))
    sink = None
    if spec.sink:  # each sink takes a large share of its rows (as indices.make_case draws them)
        valid = selection.valid(spec.cache_rows).sum() + (0 if extra is None else extra.valid(extra_kv.shape[0]).sum())
        mean = max(1.0, float(valid) / spec.queries)
        sink = torch.randn(spec.heads, generator=gen, device=device) + (math.log(mean) + spec.scale ** 2 * spec.d_qk / 2)
    dout = torch.randn(spec.queries, spec.heads, spec.d_v, generator=gen, device=device).to(dt)
    rows = extra_rows = None
    if spec.decode:  # the kernel reads FP8 bytes; the reference their values
        rows = fp8.quantize_rows(kv)
        kv = fp8.dequantize_rows(rows)
        if extra_kv is not None:
            extra_rows = fp8.quantize_rows(extra_kv)
            extra_kv = fp8.dequantize_rows(extra_rows)
    return SparseInputs(q=q, kv=kv, selection=selection, dout=dout, attn_sink=sink, extra_kv=extra_kv, extra=extra,
                        rows=rows, extra_rows=extra_rows, seed=seed)


def _slot_kinds(spec: SparseSpec, idx: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """``idx`` (T, K) int32 with ``spec.repeats`` of its slots repeating another slot's row of the same query, then
    ``spec.invalid`` of its filled slots emptied: −1, or (prefill, half of them) ``rows`` + an offset, past the
    stacked cache of ``rows`` rows (module doc)."""
    if not (spec.repeats or spec.invalid):
        return idx
    t, k = idx.shape
    if spec.repeats:
        hit = torch.rand(t, k, generator=gen, device=idx.device) < spec.repeats
        other = idx.gather(1, torch.randint(0, k, (t, k), generator=gen, device=idx.device))
        idx = torch.where(hit & (other >= 0), other, idx)
    if spec.invalid:
        hit = (torch.rand(t, k, generator=gen, device=idx.device) < spec.invalid) & (idx >= 0)
        past = torch.randint(rows, 2 * rows + 1, (t, k), generator=gen, device=idx.device, dtype=torch.int32)
        if spec.decode:
            past.fill_(-1)
        else:
            past = torch.where(torch.rand(t, k, generator=gen, device=idx.device) < 0.5, past, -1)
        idx = torch.where(hit, past, idx)
    return idx.to(torch.int32)


def grads_of(spec: SparseSpec) -> tuple[str, ...]:
    """The gradients a fwd_bwd call returns: dq, dkv, and dextra_kv / dattn_sink where the case has them."""
    return ("dq", "dkv", *(("dextra_kv",) if spec.extra is not None else ()), *(("dattn_sink",) if spec.sink else ()))


def drop_max_logits(outputs: Outputs) -> Outputs:
    """``outputs`` without max_logits (only FlashMLA's prefill returns it)."""
    return outputs.replace(max_logits=None) if "max_logits" in outputs.tensors() else outputs

"""Sweeps: axes given on the command line or in YAML, expanded into AttnSpecs.

Sequence-length syntax (``--seq-lens``): each value is one case; a comma list inside a value is one
grouped (varlen) batch of those sequences; ``A..B:xF`` expands geometrically (``512..16k:x2``) and
``A..B:+S`` arithmetically. ``k`` and ``m`` suffixes mean 1024 and 1024².
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, fields

from attnbench import features
from attnbench.serving import Batch
from attnbench.spec import PASSES, AttnSpec, normalize_dtype

_NUM = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$", re.ASCII)
_RANGE = re.compile(r"^(?P<lo>[^.]+)\.\.(?P<hi>[^:]+)(?::(?P<op>[x*+])(?P<step>\d+))?$", re.ASCII)
MAX_RANGE_VALUES = 4096
MAX_INT = 2**31 - 1
"""Largest size of any axis: kernels index with int32."""
MAX_CASES = 100_000
"""Largest sweep; a bigger product of axes is an error before anything is expanded."""


def parse_int(text: str, what: str = "value") -> int:
    """'512' -> 512, '16k' -> 16384, '1m' -> 1048576; ValueError otherwise."""
    m = _NUM.match(str(text))
    if not m or len(m.group(1)) > 30:
        raise ValueError(f"bad {what} {text!r}: expected a positive integer like 512 or 16k")
    value = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()]
    if value < 1:
        raise ValueError(f"bad {what} {text!r}: must be a positive integer")
    if value > MAX_INT:
        raise ValueError(f"bad {what} {text!r}: at most {MAX_INT}")
    return value


def parse_range(text: str, what: str = "value") -> list[int]:
    """One integer, or a range ``A..B:xF`` / ``A..B:+S`` (inclusive of B when hit)."""
    m = _RANGE.match(str(text).strip())
    if not m:
        return [parse_int(text, what)]
    lo, hi = parse_int(m.group("lo"), what), parse_int(m.group("hi"), what)
    op, step = m.group("op") or "x", int(m.group("step") or 2)
    if hi < lo:
        raise ValueError(f"bad range {text!r}: end {hi} is below start {lo}")
    if (op in "x*" and step < 2) or (op == "+" and step < 1):
        raise ValueError(f"bad range {text!r}: step must be x2 or more, or +1 or more")
    out, value = [], lo
    while value <= hi:
        out.append(value)
        if len(out) > MAX_RANGE_VALUES:
            raise ValueError(f"bad range {text!r}: expands to more than {MAX_RANGE_VALUES} values; give a larger step")
        value = value * step if op in "x*" else value + step
    return out


def comma_items(value: str, what: str, hint: str = "") -> list[str]:
    """``value`` split at commas; ValueError naming ``what`` (and ``hint``) when a list has an empty item."""
    parts = str(value).split(",")
    if len(parts) > 1 and any(not part.strip() for part in parts):
        raise ValueError(f"bad {what} {value!r}: empty item between commas{hint}")
    return parts


def parse_seq_lens(values: list[str] | str, flag: str = "--seq-lens") -> list[tuple[int, ...]]:
    """``--seq-lens`` (or ``--kv-seq-lens``) values -> one tuple of sequence lengths per case (see module doc)."""
    if isinstance(values, str):
        values = [values]
    cases: list[tuple[int, ...]] = []
    for value in values:
        value = str(value).strip()
        if not value:
            raise ValueError(f"empty {flag} value; give lengths like 4096, 128,128 or 512..16k:x2")
        if "," in value:
            parts = comma_items(value, f"{flag} value", "; give lengths like 128,128")
            cases.append(tuple(parse_int(part, "sequence length") for part in parts))
        else:
            cases.extend((n,) for n in parse_range(value, "sequence length"))
    if not cases:
        raise ValueError(f"{flag} is empty; give at least one length")
    return cases


def pair_seq_lens(queries: list[tuple[int, ...]], keys: list[tuple[int, ...]]) -> tuple[list, list]:
    """Pair ``--seq-lens`` cases with ``--kv-seq-lens`` cases: one to one when the counts are equal, and
    a single case on either side goes with every case of the other (``--seq-lens 1 --kv-seq-lens
    1k..128k:x2``: one new query against caches of 1k to 128k keys)."""
    if len(keys) == 1:
        keys = keys * len(queries)
    elif len(queries) == 1:
        queries = queries * len(keys)
    if len(queries) != len(keys):
        raise ValueError(f"--kv-seq-lens gives {len(keys)} cases and --seq-lens {len(queries)}: give one of "
                         "either, or the same number of each (they are paired in order)")
    return queries, keys


def parse_int_list(values, what: str) -> list[int]:
    """Integers from values that may each hold a comma list or a range."""
    if isinstance(values, (int, str)):
        values = [values]
    out: list[int] = []
    for value in values:
        for part in comma_items(value, what):
            if part.strip():
                out.extend(parse_range(part, what))
    if not out:
        raise ValueError(f"{what} is empty")
    return out


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """The axes of a sweep; ``specs()`` is their product."""

    batch_sizes: tuple[int, ...] = (2,)
    """Batch sizes (for varlen: repetitions of the group)."""
    seq_lens: tuple[tuple[int, ...], ...] = ((4096,),)
    """One tuple of sequence lengths per case (one value = dense, several = varlen)."""
    kv_seq_lens: tuple[tuple[int, ...], ...] | None = None
    """Key lengths, one tuple per ``seq_lens`` entry (None = equal to the query lengths)."""
    q_heads: tuple[int, ...] = (16,)
    """Query head counts."""
    kv_heads: tuple[int, ...] | None = None
    """Key/value head counts; None = equal to the query heads of each case."""
    head_sizes: tuple[int, ...] = (128,)
    """Head sizes."""
    emb_dims: tuple[int, ...] | None = None
    """Seed-003 style: embedding dims, head size = emb_dim / q_heads (overrides head_sizes)."""
    dtypes: tuple[str, ...] = ("bf16",)
    """Element types."""
    causal: tuple[bool, ...] = (False, True)
    """Causal settings to run."""
    passes: tuple[str, ...] = ("fwd", "fwd_bwd")
    """Passes to time."""
    windows: tuple[tuple[int, int] | None, ...] = (None,)
    """Sliding windows (left, right) to run, None = no window (several: e.g. a model's full and local layers)."""
    layout: str = "bshd"
    """Input layout."""
    scale: float | None = None
    """Softmax scale of every case; None = 1/sqrt(head size)."""
    features: dict = dataclasses.field(default_factory=dict)
    """Each feature's axis (``attnbench.features``): name -> the settings to run (``Feature.settings``); a
    feature left out is off."""
    batches: tuple[Batch, ...] | None = None
    """Serving batches (``attnbench.serving``), one case each; they replace batch sizes and sequence lengths."""
    page_sizes: tuple[int | None, ...] = (None,)
    """KV cache page sizes, None = no page size (contiguous keys; paged kernels use their own default)."""
    shared_prefixes: tuple[int, ...] = (0,)
    """Shared prefix lengths (0 = none)."""
    trees: tuple[tuple[int, ...] | None, ...] = (None,)
    """Speculative trees (parents of the new tokens), None = none."""
    kv_dtypes: tuple[str | None, ...] = (None,)
    """KV cache dtypes, None = that of the queries."""
    head_size_v: int | None = None
    """Value head size of every case; None = the head size."""
    mla: bool = False
    """MLA with absorbed weights (``AttnSpec.mla``): the value is the first ``head_size_v`` dims of the key row."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
        for name in ("batch_sizes", "seq_lens", "q_heads", "head_sizes", "dtypes", "causal", "passes", "windows",
                     "page_sizes", "shared_prefixes", "trees", "kv_dtypes"):
            if not getattr(self, name):
                raise ValueError(f"{name.replace('_', '-')} is empty; give at least one value")
        unknown = set(self.features) - set(features.NAMES)
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(sorted(unknown))}; known: {', '.join(features.NAMES)}")
        for name, values in self.features.items():
            if not values:
                raise ValueError(f"the {name} axis is empty; give at least one value")
        object.__setattr__(self, "features", {k: tuple(v) for k, v in self.features.items()})
        object.__setattr__(self, "dtypes", tuple(normalize_dtype(d) for d in self.dtypes))
        if self.kv_seq_lens is not None:
            if len(self.kv_seq_lens) != len(self.seq_lens):
                raise ValueError(f"{len(self.kv_seq_lens)} key-length cases for {len(self.seq_lens)} query-length "
                                 "cases; pair them one to one (see pair_seq_lens)")
            for q, k in zip(self.seq_lens, self.kv_seq_lens, strict=True):
                if len(q) != len(k):
                    raise ValueError(f"--kv-seq-lens {','.join(map(str, k))} has {len(k)} sequence(s) but --seq-lens "
                                     f"{','.join(map(str, q))} has {len(q)}: a group needs one key length per sequence")
        for p in self.passes:
            if p not in PASSES:
                raise ValueError(f"unknown pass {p!r}; allowed: {', '.join(PASSES)}")

    def _head_sizes(self, q_heads: int) -> list[int]:
        if self.emb_dims is None:
            return list(self.head_sizes)
        out = []
        for emb in self.emb_dims:
            if emb % q_heads:
                raise ValueError(f"emb_dim {emb} is not divisible by num_heads {q_heads}")
            out.append(emb // q_heads)
        return out

    def count(self) -> int:
        """Number of cases, computed without expanding them."""
        head_sizes = len(self.emb_dims) if self.emb_dims is not None else len(self.head_sizes)
        shapes = len(self.batches) if self.batches is not None else len(self.batch_sizes) * len(self.seq_lens)
        return (len(self.dtypes) * shapes * len(self.q_heads)
                * len(self.kv_heads or (1,)) * head_sizes * len(self.causal) * len(self.passes)
                * len(self.variant_settings()) * len(self.serving_settings()))

    def serving_settings(self) -> list[dict]:
        """Every combination of the page size, shared prefix, tree and KV dtype axes, as AttnSpec fields."""
        return [{"page_size": p, "shared_prefix": s, "tree": t, "kv_dtype": k}
                for p, s, t, k in itertools.product(self.page_sizes, self.shared_prefixes, self.trees, self.kv_dtypes)]

    def variant_settings(self) -> list[dict]:
        """Every combination of the window axis and the features' axes (settings, resolved per case by
        ``with_variants``)."""
        return [{"window": w, **combo}
                for w, combo in itertools.product(self.windows, features.settings_product(self.features))]

    def with_variants(self, spec: AttnSpec, setting: dict) -> AttnSpec:
        """``spec`` with one of ``variant_settings()`` (and the sweep's scale) applied."""
        combo = {k: v for k, v in setting.items() if k != "window"}
        return spec.replace(window=setting["window"], **features.resolve(combo, spec.heads_q), scale=self.scale)

    def specs(self) -> list[AttnSpec]:
        """Every case, shape-major (cases sharing inputs are adjacent), validated."""
        if (n := self.count()) > MAX_CASES:
            raise ValueError(f"the sweep has {n} cases, more than the {MAX_CASES} allowed: "
                             "give fewer values per axis or split it into several runs")
        out = []
        if self.batches is not None:
            shapes = [(1, (b.seqlens_q, b.seqlens_k)) for b in self.batches]
        else:
            pairs = list(zip(self.seq_lens, self.kv_seq_lens or self.seq_lens, strict=True))
            shapes = list(itertools.product(self.batch_sizes, pairs))
        for dtype, (batch, (seqs, keys)), hq in itertools.product(self.dtypes, shapes, self.q_heads):
            for hkv, d in itertools.product(self.kv_heads or (hq,), self._head_sizes(hq)):
                for setting, serving in itertools.product(self.variant_settings(), self.serving_settings()):
                    if serving["tree"] is not None and set(seqs) != {len(serving["tree"])}:
                        continue  # a tree is for the batches whose requests each have that many new tokens
                    for causal, pass_ in itertools.product(self.causal, self.passes):
                        base = AttnSpec(batch=batch, seqlens_q=seqs, seqlens_k=keys, heads_q=hq, heads_kv=hkv,
                                        head_dim=d, head_dim_v=self.head_size_v, dtype=dtype, causal=causal,
                                        layout=self.layout, pass_=pass_, mla=self.mla)
                        out.append(self.with_variants(base, setting).replace(**serving))
        if not out and self.trees != (None,):
            raise ValueError(f"no case has {' or '.join(str(len(t)) for t in self.trees if t)} new tokens in every "
                             "request, as the tree needs")
        return list(dict.fromkeys(out))  # a value given twice on an axis is one case, in first-seen order


GPU_DEFAULT = Sweep(batch_sizes=(2,), seq_lens=tuple((n,) for n in parse_range("128..16k:x2")), q_heads=(16,),
                    head_sizes=(128,), dtypes=("bf16",), causal=(False, True), passes=("fwd", "fwd_bwd"))
"""`attnbench run` with no arguments on a GPU."""

CPU_DEFAULT = Sweep(batch_sizes=(1,), seq_lens=((128,), (256,), (512,)), q_heads=(4,), head_sizes=(64,),
                    dtypes=("fp32",), causal=(False, True), passes=("fwd", "fwd_bwd"))
"""`attnbench run` with no arguments and no GPU: small enough for a minute on 2 cores."""

"""The attention problem being measured: one frozen, validated description per case.

Layout convention: a dense case has ``batch`` sequences, all of length ``seqlens_q[0]`` (queries) and
``seqlens_k[0]`` (keys). A grouped (varlen) case lists several lengths; the group is repeated ``batch``
times and packed into one ``(total_tokens, heads, head_dim)`` tensor with ``cu_seqlens``.

Causal masks are aligned to the lower right (flash-attn >= 2.1): query ``i`` of a sequence with
``sq`` queries and ``sk`` keys attends key ``j`` iff ``j <= i + sk - sq``. A sliding window
``(left, right)`` keeps keys in ``[i + sk - sq - left, i + sk - sq + right]``; -1 means unbounded.

The features of today's models (attention sinks, a logit softcap, ALiBi, an output gate) are fields of the case
too, each declared once in ``attnbench.features`` (its definition, flags, label, inputs and checks); this class
only holds their values. So are the features of a serving step (``attnbench.serving``): the
page size of the KV cache, a prefix every request shares, a tree of speculative tokens and an FP8 KV cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnbench import features
from attnbench.dtypes import TorchDtypes
from attnbench.serving import check_tree, short_description, tree_label
from attnbench.sta import TileMask

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

DTYPES: Mapping[str, torch.dtype] = TorchDtypes({  # torch is imported when a dtype is first looked up
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp64": "float64",
    "fp8": "float8_e4m3fn",
    "fp8-head": "float8_e4m3fn",
})
DTYPE_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
                 "float": "fp32", "float64": "fp64", "double": "fp64", "e4m3": "fp8", "float8_e4m3fn": "fp8",
                 "fp8-tensor": "fp8", "e4m3-head": "fp8-head"}
FP8_DTYPES = ("fp8", "fp8-head")
"""e4m3 inputs with float32 descales (value = stored x descale): one per tensor (``fp8``) or one per KV head
(``fp8-head``; the queries of a GQA group share theirs, as FlashAttention-3 takes them). Outputs are bf16,
drawn like the bf16 case of the same seed and then quantized (``inputs.quantize``)."""
PASSES = ("fwd", "bwd", "fwd_bwd")
LAYOUTS = ("bshd", "bhsd")
MAX_HEAD_DIM = 576
"""Largest head size: DeepSeek-V3's MLA rows (latent 512 + rope 64)."""
MAX_TOKENS = 2**31 - 1
"""Most tokens in one case (batch x summed lengths): kernels and cu_seqlens use int32 offsets."""
MAX_PAGE_SIZE = 65536
"""Most tokens a page of a paged KV cache may hold: a page of more than 64k tokens is a contiguous cache."""
KV_DTYPES = FP8_DTYPES
"""KV caches stored in e4m3 with float32 descales (per tensor, or per KV head), under queries of ``dtype``."""
LABEL_SEQUENCES = 8
"""A grouped case of more sequences than this is labelled by runs (``serving.describe``), not one by one."""


def normalize_dtype(name: str) -> str:
    """Return the canonical dtype name (fp16, bf16, fp32, fp64, fp8, fp8-head) or raise ValueError."""
    key = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return key


@dataclass(frozen=True, kw_only=True)
class AttnSpec:
    """One attention problem: shapes, dtype, masking and the pass to run."""

    batch: int = 1
    """Dense: number of sequences. Varlen: how many times the group of ``seqlens_q`` is repeated."""
    seqlens_q: tuple[int, ...] = (128,)
    """Query length of each sequence; more than one value makes a grouped (varlen) case."""
    seqlens_k: tuple[int, ...] | None = None
    """Key/value length of each sequence (same count as ``seqlens_q``); None = same as queries."""
    heads_q: int = 16
    """Number of query heads."""
    heads_kv: int | None = None
    """Number of key/value heads (GQA/MQA when smaller than ``heads_q``); None = ``heads_q``."""
    head_dim: int = 128
    """Head size of queries and keys."""
    head_dim_v: int | None = None
    """Head size of values and output; None = ``head_dim``."""
    dtype: str = "bf16"
    """Element type of q, k, v: fp16, bf16, fp32, fp64, or fp8 / fp8-head (e4m3 with descales, see FP8_DTYPES)."""
    causal: bool = False
    """Causal mask, aligned to the lower right when queries and keys differ in length."""
    window: tuple[int, int] | None = None
    """Sliding window (left, right) in tokens, -1 = unbounded; None = no window."""
    layout: str = "bshd"
    """Memory layout of the dense inputs handed to backends: bshd (flash-attn) or bhsd (SDPA)."""
    pass_: str = "fwd"
    """Which pass is timed: fwd, bwd (backward alone) or fwd_bwd."""
    scale: float | None = None
    """Softmax scale; None = 1/sqrt(head_dim)."""
    sta: TileMask | None = None
    """Sliding tile attention's mask (``attnbench.sta``): video tokens in tile order, then text; None = none."""
    sinks: bool = False
    """Attention sinks (gpt-oss): one seeded logit per query head in every row's softmax (``features.sinks``)."""
    softcap: float | None = None
    """Logit softcap c (Gemma 2): scaled scores s become c·tanh(s/c) (``features.softcap``); None = none."""
    alibi: tuple[float, ...] | None = None
    """ALiBi slopes, one per query head (``features.alibi``); None = no ALiBi."""
    gate: bool = False
    """Gated attention (Qwen3-Next): the output times sigmoid(G), G a seeded input (``features.gate``)."""
    page_size: int | None = None
    """Tokens a page of the KV cache holds, for the kernels that read a paged cache (they skip a case without
    one, or use their own default where a case names none); the others skip a case that sets it."""
    shared_prefix: int = 0
    """The first ``shared_prefix`` keys of every sequence are the same tokens, stored once (one system prompt
    for a batch of requests); they are cached tokens, never new ones."""
    tree: tuple[int, ...] | None = None
    """Speculative decoding with a tree of draft tokens: each new token's parent among the new tokens (-1:
    the last cached one); every sequence has ``len(tree)`` new tokens (``serving.tree_keep``)."""
    kv_dtype: str | None = None
    """KV cache in fp8 / fp8-head (e4m3 with descales) under queries of ``dtype``; None = keys and values in
    ``dtype``."""
    mla: bool = False
    """Multi-head latent attention with absorbed weights (DeepSeek-V3): each token's cached row is one key of
    ``head_dim`` (latent + rope, 512 + 64) and its value is the row's first ``head_dim_v`` dims (the latent), so
    keys and values are one tensor; usually one KV head for all query heads."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "seqlens_q", _lengths(self.seqlens_q, "seqlens_q"))
        sk = self.seqlens_q if self.seqlens_k is None else _lengths(self.seqlens_k, "seqlens_k")
        set_(self, "seqlens_k", sk)
        if self.heads_kv is None:
            set_(self, "heads_kv", self.heads_q)
        if self.head_dim_v is None:
            set_(self, "head_dim_v", self.head_dim)
        set_(self, "dtype", normalize_dtype(self.dtype))
        if self.window is not None:
            set_(self, "window", tuple(int(w) for w in self.window))
        if isinstance(self.sta, dict):
            set_(self, "sta", TileMask.from_dict(self.sta))
        for feature in features.FEATURES:
            set_(self, feature.name, feature.normalize(getattr(self, feature.name)))
        if self.tree is not None:
            set_(self, "tree", tuple(self.tree))
        if self.kv_dtype is not None:
            set_(self, "kv_dtype", normalize_dtype(self.kv_dtype))
        self._validate()

    def _validate(self) -> None:
        _positive("batch", self.batch)
        _positive("heads_q", self.heads_q)
        _positive("heads_kv", self.heads_kv)
        if len(self.seqlens_k) != len(self.seqlens_q):
            raise ValueError(
                f"seqlens_k has {len(self.seqlens_k)} values but seqlens_q has {len(self.seqlens_q)}; "
                "give one key length per sequence")
        for name, lengths in (("query", self.seqlens_q), ("key", self.seqlens_k)):
            if (tokens := self.batch * sum(lengths)) > MAX_TOKENS:
                raise ValueError(f"batch x {name} sequence lengths is {tokens} tokens; at most {MAX_TOKENS} "
                                 "(int32 offsets): use a smaller batch or shorter sequences")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"q-heads ({self.heads_q}) must be a multiple of kv-heads ({self.heads_kv}) for GQA/MQA")
        for name, label in (("head_dim", "head size"), ("head_dim_v", "value head size")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HEAD_DIM:
                raise ValueError(f"{label} must be an integer in 1..{MAX_HEAD_DIM}, got {value!r}")
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r}; allowed: {', '.join(PASSES)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; allowed: {', '.join(LAYOUTS)}")
        if self.window is not None and (len(self.window) != 2 or min(self.window) < -1):
            raise ValueError(f"window must be two integers (left, right), each >= -1; got {self.window!r}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale!r}")
        if self.scale is not None:
            features.base.fits(self.scale, self.dtype, "softmax scale")
        self._validate_variants()
        self._validate_serving()
        if self.sta is not None:
            if self.is_varlen or self.causal or self.has_window or self.seqlens_q != self.seqlens_k:
                raise ValueError("a sliding tile mask takes one dense self-attention sequence, without causal or "
                                 "window masks")
            if (why := self.sta.check(self.seqlens_q[0], self.heads_q)) is not None:
                raise ValueError(why)

    def _validate_variants(self) -> None:
        for feature in features.FEATURES:
            value = getattr(self, feature.name)
            if value != feature.off:
                feature.check(value, self)
        if self.sta is not None and self.variants:
            raise ValueError(f"a sliding tile mask does not combine with {_names(self.variants)}")

    def _validate_serving(self) -> None:
        if self.page_size is not None and (isinstance(self.page_size, bool) or not isinstance(self.page_size, int)
                                           or not 1 <= self.page_size <= MAX_PAGE_SIZE):
            raise ValueError(f"page size must be an integer in 1..{MAX_PAGE_SIZE}, got {self.page_size!r}")
        prefix = self.shared_prefix
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise ValueError(f"shared prefix must be a whole number of tokens, got {prefix!r}")
        if prefix:
            if not self.is_varlen:
                raise ValueError("a shared prefix needs a batch of several requests (--batch)")
            short = [(sq, sk) for sq, sk in zip(self.seqlens_q, self.seqlens_k) if sk - sq < prefix]
            if short:
                sq, sk = short[0]
                raise ValueError(f"a shared prefix of {prefix} tokens is cached, but a request with {sq} new "
                                 f"tokens over {sk} keys has only {sk - sq} cached")
        if self.tree is not None:
            check_tree(self.tree)
            if set(self.seqlens_q) != {len(self.tree)}:
                raise ValueError(f"a tree of {len(self.tree)} tokens needs {len(self.tree)} new tokens in every "
                                 f"request, not {sorted(set(self.seqlens_q))}")
            if not self.causal or self.has_window:
                raise ValueError("a tree mask replaces the causal mask among the new tokens: give causal, no window")
        if self.kv_dtype is not None:
            if self.kv_dtype not in KV_DTYPES:
                raise ValueError(f"KV cache dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
            if self.dtype not in ("fp16", "bf16"):
                raise ValueError(f"an fp8 KV cache takes fp16 or bf16 queries, not {self.dtype}")
        if self.mla:
            if not isinstance(self.mla, bool):
                raise ValueError(f"mla must be true or false, got {self.mla!r}")
            if self.heads_kv != 1:
                raise ValueError(f"MLA with absorbed weights caches one latent row per token for every query head: "
                                 f"one KV head, not {self.heads_kv} (drop --kv-heads)")
            if self.head_dim_v >= self.head_dim:
                raise ValueError(f"MLA's value is the first head_dim_v dims of the key row: value head size "
                                 f"{self.head_dim_v} must be below the head size {self.head_dim} (DeepSeek: 512 of 576)")
            if self.pass_ != "fwd" or self.is_fp8 or self.kv_dtype is not None or self.variants or self.tree:
                raise ValueError("MLA with absorbed weights is a forward of 16-bit inputs here (decode and prefill "
                                 f"of the latent cache): no backward, fp8, trees or {_names(features.NAMES)}")
        if self.serving_features and self.pass_ != "fwd":
            what = " and ".join(self.serving_features)
            what += " is an inference feature" if len(self.serving_features) == 1 else " are inference features"
            raise ValueError(f"{what}: forward only (not {self.pass_}); give --pass fwd")
        if (self.shared_prefix or self.tree is not None or self.kv_dtype) and (self.variants or self.sta is not None):
            raise ValueError(f"{_names(self.variants) or 'tile masks'} do not combine with shared prefixes, trees or "
                             "fp8 KV caches")

    # ---- derived properties -------------------------------------------------------------------
    @property
    def is_varlen(self) -> bool:
        """True for a grouped case (several sequences of possibly different lengths, packed)."""
        return len(self.seqlens_q) > 1

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def quantized(self) -> bool:
        """fp8 inputs or an fp8 KV cache: judged against the dequantized values, approximately."""
        return self.is_fp8 or self.kv_dtype is not None

    @property
    def out_dtype(self) -> torch.dtype:
        """Element type of the output (and of dout): bf16 for fp8 inputs, the input type otherwise."""
        return DTYPES["bf16"] if self.is_fp8 else self.torch_dtype

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @property
    def sequences(self) -> list[tuple[int, int]]:
        """Every (query length, key length) pair, batch repetitions included."""
        return list(zip(self.seqlens_q, self.seqlens_k, strict=True)) * self.batch

    @property
    def variants(self) -> tuple[str, ...]:
        """Names of the features (``attnbench.features``) the case has on, in label order."""
        return tuple(f.name for f in features.active(self))

    @property
    def serving_features(self) -> tuple[str, ...]:
        """Names of the serving features the case has (page size, shared prefix, tree, fp8 KV cache)."""
        return tuple(name for name, on in (("page size", self.page_size is not None),
                                           ("shared prefix", self.shared_prefix > 0),
                                           ("tree", self.tree is not None), ("fp8 KV cache", self.kv_dtype is not None))
                     if on)

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """Element type of the stored keys and values."""
        return DTYPES[self.kv_dtype] if self.kv_dtype is not None else self.torch_dtype

    @property
    def gqa(self) -> bool:
        return self.heads_kv != self.heads_q

    @property
    def has_window(self) -> bool:
        return self.window is not None and tuple(self.window) != (-1, -1)

    def replace(self, **changes) -> AttnSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def shape_key(self) -> tuple:
        """Everything that decides the input tensors (not the pass): cases sharing it share inputs."""
        return (self.batch, self.seqlens_q, self.seqlens_k, self.heads_q, self.heads_kv, self.head_dim,
                self.head_dim_v, self.dtype, self.layout, features.draw_key(self),
                self.shared_prefix, self.kv_dtype, self.mla)

    def label(self) -> str:
        """Short human label, e.g. ``b2 s4096 h16/16 d128 bf16 causal``."""
        if len(self.seqlens_q) > LABEL_SEQUENCES:
            seq = "reqs[" + short_description(self.seqlens_q, self.seqlens_k, words=False) + "]"
        elif self.is_varlen:
            seq = "varlen[" + ",".join(map(str, self.seqlens_q)) + "]"
            if self.seqlens_k != self.seqlens_q:
                seq += "/[" + ",".join(map(str, self.seqlens_k)) + "]"
        else:
            seq = f"s{self.seqlens_q[0]}" + (f"/{self.seqlens_k[0]}" if self.seqlens_k != self.seqlens_q else "")
        heads = f"h{self.heads_q}" + (f"/{self.heads_kv}" if self.gqa else "")
        dim = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        parts = [f"b{self.batch}", seq, heads, dim, self.dtype]
        if self.causal:
            parts.append("causal")
        if self.has_window:
            parts.append(f"win{self.window[0]},{self.window[1]}")
        if self.sta is not None:
            parts.append(self.sta.label())
        parts += features.label_parts(self)
        if self.shared_prefix:
            parts.append(f"prefix{self.shared_prefix}")
        if self.tree is not None:
            parts.append(tree_label(self.tree))
        if self.kv_dtype is not None:
            parts.append(f"kv-{self.kv_dtype}")
        if self.mla:
            parts.append("mla")
        if self.page_size is not None:
            parts.append(f"page{self.page_size}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        """Plain JSON-able fields (the public ones)."""
        out = {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
               for f in dataclasses.fields(self) if not f.name.startswith("_")}
        if self.sta is None:
            del out["sta"]  # records of cases without one stay as they were
        else:
            out["sta"] = self.sta.to_dict()
        for name, default in VARIANT_DEFAULTS.items():  # likewise: old case ids do not change
            if out[name] == default:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> AttnSpec:
        data = dict(data)
        for key in ("seqlens_q", "seqlens_k", "window", "tree"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


VARIANT_DEFAULTS = {**features.defaults(),
                    "page_size": None, "shared_prefix": 0, "tree": None, "kv_dtype": None, "mla": False}
"""The fields added after the first records (the features, the serving features) and their 'off' values, left out
of ``to_dict`` when off."""


def _names(names) -> str:
    """'sinks, softcap and alibi'."""
    names = list(names)
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + (names[-1] if names else "")


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")


def _lengths(values, name: str) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name.replace('_', '-')} is empty; give at least one sequence length")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"sequence lengths must be positive integers, got {v!r} in {name.replace('_', '-')}")
    return values

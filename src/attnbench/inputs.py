"""Seeded random inputs for a spec: the same tensors for every backend of a case.

Dense inputs are ``q_bshd`` (batch, seq, heads, dim); with ``layout="bhsd"`` they are stored
(batch, heads, seq, dim) and exposed as bshd views. Varlen inputs are packed ``q_thd``
(total_tokens, heads, dim) with int32 ``cu_seqlens`` offsets. Values are standard normal (never
zeros) unless an ``InputDist`` asks for larger magnitudes or outliers, where the bugs of kernels that
skip the running maximum or overflow in fp16 show. A case's features (``attnbench.features``) add the inputs
they declare (``Feature.inputs``), drawn after q, k, v and dout by the feature itself, in ``extra`` by name and
read as attributes (``inputs.<name>``; None when the case has no such input).

FP8 cases (``spec.FP8_DTYPES``) draw the bf16 inputs of the same seed and quantize q, k and v to e4m3
(``quantize``): each tensor, or each KV head (with the queries of its GQA group), is divided by
``amax / 448`` so that its largest magnitude lands on e4m3's largest finite value, and that factor is kept
as the float32 descale. The bf16 inputs stay in ``unquantized``: the accuracy check measures the kernel
against the exact attention of the dequantized inputs and against that of the bf16 ones. A case with an fp8
KV cache (``spec.kv_dtype``) quantizes k and v alone (q's descale is 1).

MLA cases (``spec.mla``) have no values of their own: ``v`` is a view of the first ``head_dim_v`` dims of ``k``.

A case with a shared prefix (``spec.shared_prefix`` = P) stores the prefix once, as a server's paged cache
does: ``prefix_k``/``prefix_v`` (P, Hkv, D), drawn after the other tensors, and ``k``/``v`` pack each request's
own keys (its keys after the prefix) with ``cu_seqlens_k`` over those. ``expanded()`` gives the same
attention with every request's keys written out (prefix first), for the kernels that take no prefix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnbench import features
from attnbench.spec import AttnSpec

DEFAULT_SEED = 0
OUTLIER_SIGMAS = 16.0
"""Magnitude of an outlier, in standard deviations of its tensor."""
FP8_MAX = 448.0
"""Largest finite e4m3 (float8_e4m3fn) value: a tensor's amax is scaled onto it."""


@dataclass(frozen=True)
class InputDist:
    """How q, k, v are drawn: N(0, 1), with q and k multiplied by ``scale`` (the logits by scale²), and a
    fraction ``outliers`` of the q, k and v elements replaced by ±OUTLIER_SIGMAS standard deviations."""

    scale: float = 1.0
    outliers: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.scale <= 1e4):
            raise ValueError(f"bad input scale {self.scale!r}: expected a number in (0, 10000]")
        if not (0 <= self.outliers <= 0.5):
            raise ValueError(f"bad outlier fraction {self.outliers!r}: expected a number in [0, 0.5]")

    @property
    def is_default(self) -> bool:
        return self.scale == 1.0 and self.outliers == 0.0

    def describe(self) -> dict:
        return {"scale": self.scale, "outliers": self.outliers}

    def apply(self, t: torch.Tensor, gen: torch.Generator, *, scaled: bool) -> torch.Tensor:
        """``t`` drawn from N(0, 1) -> this distribution (in place where possible)."""
        if self.outliers:
            hit = torch.rand(t.shape, generator=gen, device=t.device) < self.outliers
            sign = torch.where(torch.rand(t.shape, generator=gen, device=t.device) < 0.5, -1.0, 1.0)
            t = torch.where(hit, (OUTLIER_SIGMAS * sign).to(t.dtype), t)
        return t * self.scale if scaled and self.scale != 1.0 else t


@dataclass(frozen=True, kw_only=True)
class AttnInputs:
    """Tensors of one case. Dense tensors are bshd views; varlen tensors are packed thd."""

    q: torch.Tensor
    """Queries: (B, Sq, Hq, D) dense or (Tq, Hq, D) varlen."""
    k: torch.Tensor
    """Keys: (B, Sk, Hkv, D) dense or (Tk, Hkv, D) varlen."""
    v: torch.Tensor
    """Values: (B, Sk, Hkv, Dv) dense or (Tk, Hkv, Dv) varlen."""
    dout: torch.Tensor
    """Upstream gradient, shaped like the output."""
    cu_seqlens_q: torch.Tensor | None = None
    """int32 (N+1,) offsets of each query sequence in the packed tensor (varlen only)."""
    cu_seqlens_k: torch.Tensor | None = None
    """int32 (N+1,) offsets of each key sequence in the packed tensor (varlen only)."""
    max_seqlen_q: int = 0
    """Longest query sequence."""
    max_seqlen_k: int = 0
    """Longest key sequence."""
    seed: int = DEFAULT_SEED
    """Seed the tensors were drawn with (recorded)."""
    descale: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """FP8 only: float32 (Hkv,) descales of q, k, v (value = stored x descale; q's per KV-head group)."""
    unquantized: AttnInputs | None = None
    """FP8 only: the bf16 inputs that were quantized."""
    extra: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """The inputs of the case's features, by name (module doc)."""
    prefix_k: torch.Tensor | None = None
    """Cases with a shared prefix: its keys, (P, Hkv, D), once for every request (module doc)."""
    prefix_v: torch.Tensor | None = None
    """Its values, (P, Hkv, Dv)."""

    def __getattr__(self, name: str):
        # a feature's input by its name (``inputs.<name>``); None when the case has none
        if name in _FEATURE_INPUTS:
            return self.__dict__.get("extra", {}).get(name)
        raise AttributeError(name)

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def prefix_len(self) -> int:
        return 0 if self.prefix_k is None else self.prefix_k.shape[0]

    def bounds(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Varlen only: each sequence's ((query start, end), (key start, end)) in the packed tensors."""
        cu_q, cu_k = self.cu_seqlens_q.tolist(), self.cu_seqlens_k.tolist()
        return list(zip(zip(cu_q[:-1], cu_q[1:]), zip(cu_k[:-1], cu_k[1:]), strict=True))

    def request_kv(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's keys and values, packed rows [start, end), with the shared prefix (if any) in front."""
        k, v = self.k[start:end], self.v[start:end]
        if self.prefix_k is None:
            return k, v
        return torch.cat([self.prefix_k, k]), torch.cat([self.prefix_v, v])

    def expanded(self) -> AttnInputs:
        """The same case with each request's keys written out, prefix first (no ``prefix_k``); ``self`` when
        there is no prefix."""
        if self.prefix_k is None:
            return self
        per_request = [self.request_kv(c, d) for _, (c, d) in self.bounds()]
        k, v = (torch.cat([kv[i] for kv in per_request]) for i in (0, 1))
        lengths = [k_i.shape[0] for k_i, _ in per_request]
        unquantized = None if self.unquantized is None else self.unquantized.expanded()
        return dataclasses.replace(self, k=k, v=v, cu_seqlens_k=cu_seqlens(lengths, self.k.device), prefix_k=None,
                                   prefix_v=None, unquantized=unquantized)

    def leaves(self, requires_grad: bool) -> AttnInputs:
        """Fresh leaf tensors sharing storage, with ``requires_grad`` set (for one backend's graph)."""
        def leaf(t):
            return t.detach().requires_grad_(requires_grad)
        extra = {name: leaf(t) for name, t in self.extra.items()}
        return dataclasses.replace(self, q=leaf(self.q), k=leaf(self.k), v=leaf(self.v), extra=extra)


_FEATURE_INPUTS = frozenset(item.name for f in features.FEATURES for item in f.inputs)


def cu_seqlens(lengths, device) -> torch.Tensor:
    """int32 offsets [0, l0, l0+l1, ...] of sequences with the given lengths."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0).to(torch.int32)
    return out.to(device)


def make_inputs(spec: AttnSpec, device: str | torch.device = "cpu", seed: int = DEFAULT_SEED,
                dist: InputDist | None = None) -> AttnInputs:
    """Draw q, k, v and dout from N(0, 1) (or ``dist``) with a fixed seed, on ``device`` in ``spec.dtype``."""
    if spec.is_fp8:
        return quantize(make_inputs(spec.replace(dtype="bf16"), device, seed, dist), per_head=spec.dtype == "fp8-head")
    if spec.kv_dtype is not None:
        return quantize(make_inputs(spec.replace(kv_dtype=None), device, seed, dist),
                        per_head=spec.kv_dtype == "fp8-head", kv_only=True)
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = spec.torch_dtype
    drawn = 0

    factor = features.qk_scale(spec)  # a feature's inputs that make it matter (scores that reach a term's non-linear range)

    def randn(*shape):
        nonlocal drawn
        drawn += 1  # q, k, v, dout in that order: q and k carry the scale, dout no outliers
        t = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
        if factor != 1.0 and drawn <= 2:
            t = t * factor
        if dist is None or dist.is_default or drawn == 4 or plain:
            return t
        return dist.apply(t, gen, scaled=drawn <= 2)

    plain = False  # a feature's inputs are drawn as it says, without --input-scale or --outliers

    def extra(like_out):  # drawn after q, k, v and dout, so those are the same with and without features
        nonlocal plain
        out, plain = {}, True
        for feature in features.active(spec):
            out.update(feature.draw(spec, gen, device, like_out))
        plain = False
        return out

    if spec.is_varlen:
        seqs, prefix = spec.sequences, spec.shared_prefix
        own = [s - prefix for _, s in seqs]  # each request's keys after the shared prefix (all of them without)
        tq = sum(s for s, _ in seqs)
        inputs = AttnInputs(
            q=randn(tq, spec.heads_q, spec.head_dim), k=randn(sum(own), spec.heads_kv, spec.head_dim),
            v=randn(sum(own), spec.heads_kv, spec.head_dim_v), dout=randn(tq, spec.heads_q, spec.head_dim_v),
            cu_seqlens_q=cu_seqlens([s for s, _ in seqs], device), cu_seqlens_k=cu_seqlens(own, device),
            max_seqlen_q=max(s for s, _ in seqs), max_seqlen_k=max(s for _, s in seqs), seed=seed,
            extra=extra(lambda: randn(tq, spec.heads_q, spec.head_dim_v)))
        if prefix:  # drawn last, so the requests' own tensors are those of the same seed's other cases
            inputs = dataclasses.replace(inputs, prefix_k=randn(prefix, spec.heads_kv, spec.head_dim),
                                         prefix_v=randn(prefix, spec.heads_kv, spec.head_dim_v))
        return latent_values(spec, inputs)

    b, sq, sk = spec.batch, spec.seqlens_q[0], spec.seqlens_k[0]

    def dense(s, h, d):
        if spec.layout == "bhsd":
            return randn(b, h, s, d).transpose(1, 2)
        return randn(b, s, h, d)

    return latent_values(spec, AttnInputs(
        q=dense(sq, spec.heads_q, spec.head_dim), k=dense(sk, spec.heads_kv, spec.head_dim),
        v=dense(sk, spec.heads_kv, spec.head_dim_v), dout=dense(sq, spec.heads_q, spec.head_dim_v),
        max_seqlen_q=sq, max_seqlen_k=sk, seed=seed, extra=extra(lambda: dense(sq, spec.heads_q, spec.head_dim_v))))


def latent_values(spec: AttnSpec, inputs: AttnInputs) -> AttnInputs:
    """MLA (``spec.mla``): the values are the first ``head_dim_v`` dims of the keys, a view of the same rows
    (the drawn values are dropped); other cases unchanged."""
    if not spec.mla:
        return inputs
    dv = spec.head_dim_v
    prefix_v = None if inputs.prefix_k is None else inputs.prefix_k[..., :dv]
    return dataclasses.replace(inputs, v=inputs.k[..., :dv], prefix_v=prefix_v)


def _by_kv_head(t: torch.Tensor, hkv: int) -> torch.Tensor:
    """(..., H, D) -> (..., Hkv, H / Hkv, D): the heads of each KV head's group side by side (a view)."""
    return t.unflatten(-2, (hkv, t.shape[-2] // hkv))


def quantize(inputs: AttnInputs, *, per_head: bool, kv_only: bool = False) -> AttnInputs:
    """``inputs`` with q, k and v (k and v alone with ``kv_only``: q's descale is 1) in e4m3 and their
    descales (see the module doc); dout stays as it is. A shared prefix shares its tensor's descale."""
    hkv = inputs.k.shape[-2]
    stored, descales = {}, []
    for name, t, prefix in (("q", inputs.q, None), ("k", inputs.k, inputs.prefix_k), ("v", inputs.v, inputs.prefix_v)):
        if kv_only and name == "q":
            descales.append(torch.ones(hkv, dtype=torch.float32, device=t.device))
            continue
        parts = [_by_kv_head(x.float(), hkv) for x in (t, prefix) if x is not None]
        if per_head:
            amax = torch.stack([x.abs().movedim(-3, 0).reshape(hkv, -1).amax(dim=1) for x in parts]).amax(dim=0)
        else:
            amax = torch.stack([x.abs().amax() for x in parts]).amax().expand(hkv)
        descale = (amax.clamp_min(torch.finfo(torch.float32).tiny) / FP8_MAX).contiguous()
        stored[name], *rest = (_e4m3(x, descale) for x in parts)
        if rest:
            stored["prefix_" + name] = rest[0]
        descales.append(descale)
    return dataclasses.replace(inputs, **stored, descale=tuple(descales), unquantized=inputs)


def _e4m3(grouped: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """(..., Hkv, G, D) float32 values as e4m3 (..., H, D): value / its KV head's descale."""
    return (grouped / descale[:, None, None]).flatten(-3, -2).to(torch.float8_e4m3fn)


def to_e4m3(t: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """(..., H, D) values stored as e4m3 with the (Hkv,) descales of ``quantize``: the very bits it stored for them."""
    return _e4m3(_by_kv_head(t.float(), descale.shape[0]), descale)


def _value(t: torch.Tensor | None, descale: torch.Tensor, hkv: int, dtype: torch.dtype) -> torch.Tensor | None:
    """What an e4m3 tensor (..., H, D) stands for: stored x its KV head's descale, in ``dtype``."""
    if t is None:
        return None
    return (_by_kv_head(t.to(dtype), hkv) * descale.to(dtype)[:, None, None]).flatten(-3, -2)


def dequantized(inputs: AttnInputs, dtype: torch.dtype = torch.float32) -> AttnInputs:
    """FP8 ``inputs`` as the values they stand for (stored x descale) in ``dtype``; others unchanged."""
    if inputs.descale is None:
        return inputs
    hkv = inputs.k.shape[-2]

    def value(t, descale):
        return _value(t, descale, hkv, dtype)
    dq, dk, dv = inputs.descale
    return dataclasses.replace(inputs, q=value(inputs.q, dq), k=value(inputs.k, dk), v=value(inputs.v, dv),
                               prefix_k=value(inputs.prefix_k, dk), prefix_v=value(inputs.prefix_v, dv),
                               descale=None, unquantized=None)


def kv_dequantizer(inputs: AttnInputs, dtype: torch.dtype):
    """``(k, v) -> (k, v)`` in ``dtype``: an fp8 KV cache (e4m3 stored x descale) made values again, as a kernel
    without fp8 support must before it reads them; the identity for other inputs."""
    if inputs.descale is None or inputs.k.dtype != torch.float8_e4m3fn or inputs.q.dtype == torch.float8_e4m3fn:
        return lambda k, v: (k, v)
    _, dk, dv = inputs.descale
    hkv = inputs.k.shape[-2]

    def dequantize(k, v):
        return _value(k, dk, hkv, dtype), _value(v, dv, hkv, dtype)
    return dequantize


def split_varlen(packed: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    """Packed (T, H, D) -> list of (S_i, H, D) views, one per sequence."""
    offsets = cu.tolist()
    return [packed[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Stack equally shaped q, k, v (..., H, D) into (..., 3, H, D) (flash-attn's qkvpacked layout)."""
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"qkv packing needs equal shapes, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    return torch.stack([q, k, v], dim=-3)


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Stack equally shaped k, v (..., H, D) into (..., 2, H, D) (flash-attn's kvpacked layout)."""
    if k.shape != v.shape:
        raise ValueError(f"kv packing needs equal shapes, got {tuple(k.shape)}, {tuple(v.shape)}")
    return torch.stack([k, v], dim=-3)

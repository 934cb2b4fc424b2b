"""DeepSeek-V3.2's lightning indexer as an operator of the pipeline (``--op indexer``): FP8 logits and the top-k
per query, checked the way a selection must be (``indexer.check_selection``), timed beside the sparse attention
it feeds.

A case: ``s_q`` queries, the last of an ``s_kv``-token sequence (causal: query t sees keys 0..pos), ``heads`` indexer
heads of ``dim`` (V3.2: 64 of 128), ``topk`` kept (2048); inputs from ``indexer.draw_indexer_inputs`` (FP8 q and k
with their scales, per-head weights). A kernel returns ``indices`` (T, topk) and, where it has them, ``logits``
(T, S) (−inf where a key is unseen).

**The check** (``check``, replacing the tensor comparison of the other operators): the selection is right when
``check_selection`` finds nothing missing, unseen, repeated, below the k-th score or mismatched beyond one bf16
round-off of each query's largest |logit| (ties and near-ties may be broken either way); the logits, where a
kernel returns them, must be within one bf16 round-off (rel-L2 ≤ 2^-8) of the exact ones over the visible keys.

**FLOPs**: the q·k products of the visible (query, key) pairs, 2 · heads · dim each (ReLU, weights and the top-k
not counted, as attention's softmax is not). **Bytes**: q and k in FP8, k's scales and the weights in fp32, the
chosen indices (int32) written.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import ClassVar

import torch

from attnbench.backends.base import Backend, Capabilities, Prepared
from attnbench.outputs import Outputs
from attnbench.sparse.indexer import (
    INDEX_DIM,
    INDEX_HEADS,
    INDEX_TOPK,
    check_selection,
    compare_logits,
    draw_indexer_inputs,
    indexer_baseline,
)

INDEXER_DRAW_BYTES = 20
"""Bytes per element of q (T x Hi x Di) and k (S x Di) while the inputs are drawn: fp32 normals, their bf16, the
fp32 tiles and quotient of the quantisation, the e4m3 result (peak RSS on a CPU: 14-19)."""
INDEXER_CALL_BYTES = 8
"""Bytes per (query, head, key) of a call that holds the plain product: fp32 q·k and its ReLU (peak RSS: 8.0)."""
LOGITS_REL_L2 = 2 ** -8
"""Largest rel-L2 of a kernel's logits over the visible keys (one bf16 round-off)."""
RULE = ("the selection has no key missing, unseen, repeated or below the k-th score, and the logits, where returned, "
        "are within one bf16 round-off (rel-L2 2^-8) of the exact ones")
"""The check's rule in words, as a verdict's record states it (``check``)."""


@dataclass(frozen=True, kw_only=True)
class IndexerSpec:
    s_q: int = 4096
    """Queries (the last s_q tokens of the sequence)."""
    s_kv: int = 8192
    """Keys (cached tokens)."""
    heads: int = INDEX_HEADS
    dim: int = INDEX_DIM
    topk: int = INDEX_TOPK
    pass_: str = "fwd"
    """Always fwd (the indexer is trained apart from attention's gradient)."""

    operator: ClassVar[str] = "indexer"

    def __post_init__(self) -> None:
        for name in ("s_q", "s_kv", "heads", "dim", "topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.s_q > self.s_kv:
            raise ValueError(f"{self.s_q} queries are more than the {self.s_kv} keys they are the last of")
        if self.topk > self.s_kv:
            raise ValueError(f"top-k {self.topk} is more than the {self.s_kv} keys")
        if self.pass_ != "fwd":
            raise ValueError(f"the indexer has a forward only (--pass fwd), not {self.pass_!r}")

    @property
    def dtype(self) -> str:
        return "fp8"

    def replace(self, **changes) -> IndexerSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"operator": self.operator, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> IndexerSpec:
        return cls(**{k: v for k, v in data.items() if k != "operator"})

    def shape_key(self) -> tuple:
        return ("indexer", *dataclasses.astuple(self))

    def label(self) -> str:
        return f"indexer q{self.s_q} kv{self.s_kv} h{self.heads} d{self.dim} top{self.topk} fp8"

    def visible_pairs(self) -> int:
        """(query, key) pairs the causal queries see."""
        first = self.s_kv - self.s_q + 1
        return self.s_q * first + self.s_q * (self.s_q - 1) // 2


@dataclass(frozen=True)
class SeededIndexerInputs:
    inputs: object
    seed: int

    @property
    def q(self) -> torch.Tensor:
        return self.inputs.q


class Indexer:
    name = "indexer"
    flop_note = "the indexer's count the q·k products of the visible (query, key) pairs"
    cpu_share = 0.2
    """Of plain attention math's fp32 FLOP rate (``operators.Attention.cpu_share``; fp8 has no CPU matmul, the
    kernel computes in fp32), what indexer-torch reaches of the count above: 0.23 (2-core EPYC, one thread, the
    CPU default shape, 2026-12-08)."""

    def spec_from_dict(self, data: dict) -> IndexerSpec:
        return IndexerSpec.from_dict(data)

    def make_inputs(self, spec: IndexerSpec, device, seed: int, dist=None):
        if dist is not None and not dist.is_default:
            raise ValueError("--input-scale and --outliers shape attention's q, k, v; the indexer draws its own")
        gen = torch.Generator(device=device).manual_seed(seed)
        return SeededIndexerInputs(draw_indexer_inputs(spec.s_q, spec.s_kv, heads=spec.heads, dim=spec.dim,
                                                       generator=gen, device=device), seed)

    def flops(self, spec: IndexerSpec, convention: str = "exact", inputs=None) -> float:
        return 2.0 * spec.heads * spec.dim * spec.visible_pairs()

    def bytes_moved(self, spec: IndexerSpec, inputs=None) -> float:
        return float(spec.s_q * spec.heads * spec.dim + spec.s_kv * spec.dim + 4 * spec.s_kv
                     + 4 * spec.s_q * spec.heads + 4 * spec.s_q * spec.topk)

    def info(self, spec, inputs) -> dict:
        return {}

    def memory_guard(self, spec: IndexerSpec, backend, device, *, inputs_allocated: bool = True) -> str | None:
        """Why the case cannot fit (``memory.too_big``): the inputs as they are drawn (``backend`` None), or a call
        that holds the plain (T, Hi, S) product (``INDEXER_CALL_BYTES``), beside the inputs unless they already
        sit on the device."""
        from attnbench.memory import too_big
        t, s, hd = spec.s_q, spec.s_kv, spec.heads * spec.dim
        if backend is None:
            return too_big(INDEXER_DRAW_BYTES * (t * hd + s * spec.dim) + 4 * t * spec.heads, device, rough=True)
        held = t * hd + s * spec.dim + 4 * (s + t * spec.heads + 2 * t)  # e4m3 q and k, scales, weights, bounds
        call = 4 * t * hd + INDEXER_CALL_BYTES * t * spec.heads * s + 9 * t * s  # fp32 q, the product, the logits
        return too_big(call + (0 if inputs_allocated else held), device, rough=True)

    def columns(self, spec: IndexerSpec) -> dict:
        return dict(batch=1, seq_len=spec.s_q, seq_len_k=spec.s_kv, num_seqs=1, total_q=spec.s_q, heads_q=spec.heads,
                    heads_kv=1, head_dim=spec.dim, head_dim_v=0, emb_dim=spec.heads * spec.dim, dtype="fp8",
                    causal=1, varlen=0, window=json.dumps(None), layout="bshd")

    def axes(self, spec: IndexerSpec) -> dict[str, str]:
        return {"op": "indexer", "pass": "fwd", "dtype": "fp8", "seq": str(spec.s_q), "keys": f"keys {spec.s_kv}",
                "topk": f"top-k {spec.topk}", "heads": f"h{spec.heads}", "head_dim": f"d{spec.dim}"}

    def sweep(self, axes: dict, options: dict) -> list[IndexerSpec]:
        for axis, flag, only in (("batch_sizes", "--batch-size", 1), ("dtypes", "--dtype", "fp8"),
                                 ("passes", "--pass", "fwd")):
            if axes.get(axis) and set(axes[axis]) != {only}:
                raise ValueError(f"an indexer case is one sequence's FP8 forward: drop {flag}")
        # a CPU: a fresh sequence's 512 queries over their own 512 keys, top-k 128 unless given (its first 127
        # queries see fewer keys than top-k: a kernel that pads with keys they cannot see fails)
        small = bool(options.get("small"))
        groups = axes.get("seq_lens") or [(512 if small else 4096,)]
        if any(len(s) > 1 for s in groups):  # its first length alone would be measured
            raise ValueError(f"an indexer case is one sequence, not a group "
                             f"({','.join(map(str, next(s for s in groups if len(s) > 1)))}): give --seq-lens "
                             "a length per case")
        seqs = [s[0] for s in groups]
        specs = [IndexerSpec(s_q=s_q, s_kv=s_kv or max(s_q, 512 if small else 8192), heads=heads, dim=dim, topk=topk)
                 for s_q, s_kv, heads, dim, topk in itertools.product(
                     seqs, axes.get("kv_seq_lens") or [None], axes.get("q_heads") or [INDEX_HEADS],
                     axes.get("head_sizes") or [INDEX_DIM], axes.get("topks") or [128 if small else INDEX_TOPK])]
        return list(dict.fromkeys(specs))

    def bug_prone(self, asked: IndexerSpec, given: frozenset[str], device: str) -> list[IndexerSpec]:
        """verify's cases at ``asked``'s heads and head size: a causal prefill whose queries are the whole sequence
        (s_q = s_kv), so the first top-k − 1 queries see fewer keys than top-k (a kernel that pads their lists with
        keys they cannot see, or with repeats, fails), and odd sizes with queries shorter than the keys (a causal
        mask aligned to the wrong corner, a dropped tail block). ``given`` changes nothing here: the heads and head
        size given are ``asked``'s already."""
        if device.startswith("cuda"):
            shapes = [dict(s_q=4096, s_kv=4096, topk=2048), dict(s_q=1000, s_kv=4999, topk=2048)]
        else:
            shapes = [dict(s_q=77, s_kv=77, topk=32), dict(s_q=33, s_kv=301, topk=50)]
        return [asked.replace(**shape) for shape in shapes]

    def check(self, spec: IndexerSpec, inputs, outputs: Outputs, backend) -> dict:
        """The accuracy dict of a kernel's selection (module doc)."""
        got = outputs.tensors()
        if "indices" not in got:
            return {"verdict": "fail", "exact": True, "reason": "indices: not returned", "tensors": {}}
        sel = check_selection(got["indices"], inputs.inputs, spec.topk)
        result = {"verdict": "pass", "exact": True, "reference": "the exact logits (fp64 cpu / fp32 gpu, TF32 off)",
                  "tensors": {}, "selection": dataclasses.asdict(sel), "rule": RULE}
        problems = [f"{n} {k}" for k, n in (("missing", sel.missing), ("unseen", sel.unseen),
                                             ("repeated", sel.repeated), ("below the k-th score", sel.below),
                                             ("mismatched", sel.mismatched)) if n]
        if "logits" in got:
            metrics = compare_logits(got["logits"], inputs.inputs)
            result["tensors"]["logits"] = metrics
            result["limits"] = {"logits": {"rel_l2": LOGITS_REL_L2}}
            if not metrics["rel_l2"] <= LOGITS_REL_L2:
                problems.append(f"logits rel_l2 {metrics['rel_l2']:.3g} > {LOGITS_REL_L2:.3g}")
        if problems:
            result.update(verdict="fail", reason="selection: " + ", ".join(problems))
        return result


class _IndexerBackend(Backend):
    operator = "indexer"
    capabilities = Capabilities(dtypes=("fp8",), backward=False)


class IndexerTorch(_IndexerBackend):
    name = "indexer-torch"
    description = "the indexer in PyTorch (DeepGEMM's reference math): fp32 logits, torch.topk"

    def prepare(self, spec, inputs) -> Prepared:
        def call() -> Outputs:
            logits, idx = indexer_baseline(inputs.inputs, spec.topk)
            return Outputs(indices=idx, logits=logits)
        return Prepared(fn=call, info={"kernel": "einsum + relu + weights + topk (torch)"})


class IndexerFla(_IndexerBackend):
    name = "indexer-fla"
    description = "fla-core's DSA indexer (fla.ops.dsa.naive_dsa_indexer: relu, weights, causal top-k)"
    package = "fla"
    distribution = "fla-core"
    install = "pip install fla-core"

    def extra_reason(self, spec, device) -> str | None:
        if spec.s_q != spec.s_kv:
            return "fla's indexer masks a square causal matrix: queries and keys of one sequence (s_q = s_kv)"
        return None

    def prepare(self, spec, inputs) -> Prepared:
        from fla.ops.dsa.naive import naive_dsa_indexer
        t = inputs.inputs
        q = t.q.float()[None]
        k = (t.k.float() * t.k_scale[:, None])[None]
        w = t.weights[None]

        def call() -> Outputs:
            idx = naive_dsa_indexer(q, k, w, topk=spec.topk, scale=1.0, activation="relu")
            return Outputs(indices=idx[0].to(torch.int32))
        return Prepared(fn=call, info={"kernel": "fla.ops.dsa.naive_dsa_indexer"})


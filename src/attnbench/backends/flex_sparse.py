"""FlexAttention with a block-sparse BlockMask at a target block sparsity (``flex-sparse``).

The block map (which key blocks each query block attends, per head) is built in ``prepare`` as
(heads, q_blocks, kv_blocks) booleans and handed to ``BlockMask.from_kv_blocks``; no dense S x S
mask ever exists. Blocks wholly inside the causal region are passed as *full* blocks (no mask_mod),
the rest as partial blocks with the causal mask_mod. Patterns:

* ``random``: each query block keeps a seeded random subset of the blocks its mask allows;
* ``local``: the diagonal block, an attention sink (key block 0), then the blocks nearest the diagonal;
* ``strided``: blocks at multiples of a stride from the diagonal (nearest first), stride = 1/(1-sparsity).

Every query block keeps ``max(1, round((1 - sparsity) * allowed))`` blocks, so the achieved sparsity
is close to, not exactly, the target: ``info["sparsity"]`` is the achieved block sparsity (skipped
blocks / blocks the causal-or-full mask allows). FLOPs: the record's ``flops`` keeps attnbench's
convention (the mask's attended pairs, as if dense), so TFLOP/s is a dense-equivalent rate comparable
with dense kernels; ``info["effective_flops"]`` counts the pairs in the attended blocks exactly
(partial blocks at the sequence end and on the diagonal included) and ``info["dense_flops"]`` every
pair. The result is *not* the dense result: accuracy against a dense reference differs by design
(``exact=False``). Options are constructor keywords (``--backend-opt flex-sparse.sparsity=0.9``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from attnbench import metrics
from attnbench.backends.base import Backend, Capabilities, Prepared, autograd_closure
from attnbench.backends.flex import FLEX_MIN_HEAD_DIM, flex_head_dim_reason
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

PATTERNS = ("random", "local", "strided")
MAX_SPARSITY = 0.95


def block_pair_counts(sq: int, sk: int, block: int, causal: bool) -> np.ndarray:
    """(q_blocks, kv_blocks) int64: (query, key) pairs the base mask attends inside each block."""
    n_kv = math.ceil(sk / block)
    lo = np.arange(n_kv, dtype=np.int64) * block
    width = np.minimum(lo + block, sk) - lo
    if not causal:
        per_row = np.broadcast_to(width, (sq, n_kv))
    else:  # query r attends keys <= r + sk - sq (lower right)
        last = np.arange(sq, dtype=np.int64)[:, None] + (sk - sq)
        per_row = np.clip(last - lo[None, :] + 1, 0, width[None, :])
    starts = np.arange(0, sq, block)
    return np.add.reduceat(per_row, starts, axis=0).astype(np.int64)


def full_blocks(sq: int, sk: int, block: int, causal: bool) -> np.ndarray:
    """(q_blocks, kv_blocks) bool: blocks where every one of block x block pairs is attended."""
    counts = block_pair_counts(sq, sk, block, causal)
    return counts == block * block


def block_map(heads: int, sq: int, sk: int, *, block: int, sparsity: float, pattern: str, causal: bool,
              seed: int = 0) -> torch.Tensor:
    """(heads, q_blocks, kv_blocks) bool: the attended blocks (CPU), a subset of the mask's allowed blocks."""
    allowed = torch.from_numpy(block_pair_counts(sq, sk, block, causal) > 0)
    n_q, n_kv = allowed.shape
    qi = torch.arange(n_q)[:, None]
    kj = torch.arange(n_kv)[None, :]
    diag = (qi * block + block - 1).clamp(max=sq - 1) + (sk - sq)  # last key of the block's last query
    dist = (diag // block - kj).abs().float()
    if pattern == "random":
        gen = torch.Generator().manual_seed(seed)
        prio = torch.rand(heads, n_q, n_kv, generator=gen)
    elif pattern == "local":
        prio = (-dist).expand(heads, n_q, n_kv).clone()
        prio[..., 0] = float(n_kv)  # the attention sink, second only to the diagonal block
        prio = prio.masked_fill(dist == 0, float("inf"))
    elif pattern == "strided":
        stride = max(1, round(1.0 / max(1e-9, 1.0 - sparsity)))
        prio = (-((dist % stride) * n_kv + dist)).expand(heads, n_q, n_kv).clone()
    else:
        raise ValueError(f"unknown pattern {pattern!r}; allowed: {', '.join(PATTERNS)}")
    prio = prio.masked_fill(~allowed, float("-inf"))
    n_allowed = allowed.sum(-1)
    keep_n = torch.where(n_allowed > 0, torch.clamp(torch.round((1 - sparsity) * n_allowed), min=1), 0)
    order = prio.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(n_kv).expand_as(order).contiguous())
    return (ranks < keep_n[None, :, None]) & allowed


def sparse_stats(spec: AttnSpec, kept: torch.Tensor, block: int) -> dict:
    """Achieved block sparsity and FLOPs of ``kept`` (heads, q_blocks, kv_blocks) for ``spec``."""
    sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
    counts = torch.from_numpy(block_pair_counts(sq, sk, block, spec.causal))
    allowed_blocks = int((counts > 0).sum()) * spec.heads_q
    kept_pairs = int((counts[None] * kept).sum()) * spec.batch  # summed over heads and batch
    per_pair = 2.0 * (spec.head_dim + spec.head_dim_v) * metrics.PASS_FLOP_FACTOR[spec.pass_]
    return {"sparsity": 1.0 - int(kept.sum()) / allowed_blocks if allowed_blocks else 0.0,
            "effective_flops": per_pair * kept_pairs,
            "dense_flops": metrics.flops(spec, convention="dense"),
            "exact_flops": metrics.flops(spec)}


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


class FlexSparse(Backend):
    name = "flex-sparse"
    description = "FlexAttention, block-sparse BlockMask at a target sparsity (random/local/strided)"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), max_head_dim=256, exact=False)
    default_sweep = False  # a sparsity study, not a dense kernel: only when asked for

    option_ranges = {"sparsity": (0.0, MAX_SPARSITY), "block": (16, 2**30), "seed": (0, 2**63 - 1)}

    def __init__(self, sparsity: float = 0.5, pattern: str = "random", block: int = 128, seed: int = 0):
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0 <= sparsity <= MAX_SPARSITY:
            raise ValueError(f"sparsity must be a number in [0, {MAX_SPARSITY}], got {sparsity!r}")
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {block!r}")
        self.sparsity, self.pattern, self.block, self.seed = float(sparsity), pattern, block, int(seed)

    def unavailable_reason(self) -> str | None:
        try:
            from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no FlexAttention (needs >= 2.5)"
        return None

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        dev = torch.device(device).type
        if dev == "cpu" and spec.pass_ != "fwd":
            return "FlexAttention has no backward on CPU"
        if dev == "cuda" and min(spec.head_dim, spec.head_dim_v) < FLEX_MIN_HEAD_DIM:
            return flex_head_dim_reason()
        return None

    def block_mask(self, spec: AttnSpec, device):
        """(BlockMask, kept block map) for ``spec`` on ``device``."""
        from torch.nn.attention.flex_attention import BlockMask
        sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
        kept = block_map(spec.heads_q, sq, sk, block=self.block, sparsity=self.sparsity, pattern=self.pattern,
                         causal=spec.causal, seed=self.seed)
        full = kept & torch.from_numpy(full_blocks(sq, sk, self.block, spec.causal))
        partial = kept & ~full

        def as_kv(blocks):  # (H, nq, nkv) bool -> counts (1, H, nq), indices (1, H, nq, nkv), kept first
            order = (~blocks).to(torch.int8).argsort(dim=-1, stable=True)
            return blocks.sum(-1).to(torch.int32)[None].to(device), order.to(torch.int32)[None].to(device)
        offset = sk - sq

        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx
        num, idx = as_kv(partial)
        full_num, full_idx = as_kv(full)
        mask = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=self.block,
                                        mask_mod=causal if spec.causal else None, seq_lengths=(sq, sk))
        return mask, kept

    def _forward(self, spec: AttnSpec, mask):
        flex = _compiled_flex()
        gqa = spec.heads_q != spec.heads_kv

        def forward(q_bhsd, k_bhsd, v_bhsd):
            return flex(q_bhsd, k_bhsd, v_bhsd, block_mask=mask, scale=spec.softmax_scale, enable_gqa=gqa)
        return forward

    def functional(self, spec: AttnSpec):
        """fn(q_bshd, k_bshd, v_bshd) -> out_bshd; the block mask is built on the first call's device."""
        cache: dict = {}

        def fn(q, k, v):
            if q.device not in cache:
                cache[q.device] = self._forward(spec, self.block_mask(spec, q.device)[0])
            return cache[q.device](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        return fn

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mask, kept = self.block_mask(spec, inputs.q.device)
        forward = self._forward(spec, mask)

        def pre(q, k, v):
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def run(q, k, v):
            return forward(q, k, v).transpose(1, 2)
        info = self.base_info() | {"kernel": "flex_attention+BlockMask", "pattern": self.pattern,
                                   "block": self.block, "target_sparsity": self.sparsity,
                                   "mask_seed": self.seed} | sparse_stats(spec, kept, self.block)
        return Prepared(fn=autograd_closure(spec, inputs, run, pre), info=info)

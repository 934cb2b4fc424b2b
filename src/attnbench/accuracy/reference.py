"""Exact attention, forward and backward, in blocks: the reference every backend is compared with.

Computed in fp64 on the CPU and in fp32 on a GPU for fp16/bf16 inputs (fp64 for fp32/fp64 inputs),
with TF32 switched off for the duration of the call only (``exact_fp32_matmul``). Queries are processed in blocks of ``BlockSizes.q`` rows against
keys in blocks of ``BlockSizes.k`` columns with an online softmax, so no (Sq, Sk) matrix is ever
built: the extra memory is the outputs themselves plus a few (B·H, block_q, block_k) score blocks.
Key blocks a causal mask or window hides completely are never computed, so causal costs about half.

The backward recomputes the probabilities from the log-sum-exp like a flash kernel, in the compute
dtype: ``P = exp(S − lse)``, ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP − rowsum(dO ∘ O))``,
``dQ = scale · dS K``, ``dK = scale · dSᵀ Q``. With GQA the q heads of a group are stacked along the
row axis, so dK and dV are summed over the group by the matmul itself.

Masks follow ``spec.py``: lower-right aligned causal, windows ``(left, right)`` with -1 unbounded, and a
sliding tile mask (``spec.sta``, one window per head) on top; key blocks a mask hides entirely are skipped.
Rows that attend no key get ``out = 0``, ``lse = -inf`` and zero gradients. A tree of speculative tokens
(``spec.tree``) replaces the causal mask among each sequence's new tokens (``masks.keep_mask``).

A serving batch is a grouped case like any other, computed a request at a time; a shared prefix
(``inputs.prefix_k``) is put in front of each request's own keys, one request at a time.

The features of the case (``attnbench.features``) are one term each, at their stage: a score feature changes
each score block in place before the mask (``Feature.block_term``; the derivative it returns multiplies dS in
the backward); a row feature joins each row's softmax at the end of the forward (``Feature.rows_forward``), so
the backward, which recomputes P from that LSE, needs only its own input's gradient (``Feature.rows_grad``); an
output feature acts on attention's output (``Feature.output``), so the backward hands attention the dO it
returns (``Feature.output_backward``) and takes the gradient of its input from it.

Shapes (``Reference``, the named tensors of ``attnbench.outputs``): ``out``/``dq``/``dk``/``dv`` come in the input layout, (B, S, H, D) dense or
packed (T, H, D) varlen, as views of head-major buffers (not necessarily contiguous). ``lse`` is the
natural-log log-sum-exp of the scaled scores, (B, Hq, Sq) dense or (Hq, Tq) varlen — the shapes
flash-attn returns. Everything is in the compute dtype (fp32 or fp64).

Default tiles (1024 query rows x 4096 keys, all heads at once via batched matmuls) keep each score
tile at 2**26 elements (256 MiB in fp32 for 16 heads) so the GEMMs are large enough to run near
peak on a GPU; ``BlockSizes`` makes them tunable (``benchmarks/reference_scaling.py``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnbench import features
from attnbench.inputs import AttnInputs
from attnbench.masks import keep_mask
from attnbench.outputs import Outputs, grad_name
from attnbench.spec import AttnSpec


@dataclass(frozen=True, kw_only=True)
class BlockSizes:
    """Tile sizes of the blocked computation (bigger = faster on a GPU, more memory)."""

    q: int = 1024
    """Query rows per block (per head)."""
    k: int = 4096
    """Keys per block."""
    max_elems: int = 2 ** 26
    """Cap on one score block, B·Hq·rows·keys elements (2**26 fp32 = 256 MiB); rows shrink to fit."""

    def __post_init__(self) -> None:
        for name in ("q", "k", "max_elems"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"block size {name} must be a positive integer, got {value!r}")


Reference = Outputs
"""Exact outputs of one case (see the module docstring for shapes): the same named tensors a call returns."""


@contextmanager
def exact_fp32_matmul():
    """Switch TF32 off for cuBLAS and cuDNN inside the block; restore the caller's settings after.

    torch >= 2.9 has the ``fp32_precision`` API and refuses to mix it with the legacy
    ``allow_tf32`` flags once either was used, so the new API is used where it exists.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):
        owners = (matmul, cudnn.conv, cudnn.rnn)
        saved = [o.fp32_precision for o in owners]
        try:
            for o in owners:
                o.fp32_precision = "ieee"
            yield
        finally:
            for o, value in zip(owners, saved, strict=True):
                o.fp32_precision = value
    else:  # pragma: no cover - torch < 2.9
        saved = (matmul.allow_tf32, cudnn.allow_tf32)
        try:
            matmul.allow_tf32 = cudnn.allow_tf32 = False
            yield
        finally:
            matmul.allow_tf32, cudnn.allow_tf32 = saved


def compute_dtype_for(device: torch.device | str, input_dtype: torch.dtype | None = None) -> torch.dtype:
    """Precision of the reference: fp64 on the CPU; on a GPU fp32 for 16-bit inputs (its round-off is
    ~1000x below theirs, and it halves memory and traffic) but fp64 for fp32/fp64 inputs, which an fp32
    reference could not judge."""
    if torch.device(device).type == "cpu" or input_dtype in (torch.float32, torch.float64):
        return torch.float64
    return torch.float32


# ---- masks on blocks --------------------------------------------------------------------------
def mask_bounds(causal: bool, window: tuple[int, int] | None) -> tuple[int, int]:
    """(left, right) reach around the aligned diagonal, -1 = unbounded (as masks.keep_mask)."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _key_range(a: int, b: int, sq: int, sk: int, left: int, right: int) -> tuple[int, int]:
    """Keys [lo, hi) that any of the query rows [a, b) may attend (empty when hi <= lo)."""
    off = sk - sq
    lo = max(0, a + off - left) if left >= 0 else 0
    hi = min(sk, b - 1 + off + right + 1) if right >= 0 else sk
    return lo, hi


def _query_range(c: int, d: int, sq: int, sk: int, left: int, right: int) -> tuple[int, int]:
    """Query rows [lo, hi) that attend at least one of the keys [c, d)."""
    off = sk - sq
    lo = max(0, c - off - right) if right >= 0 else 0
    hi = min(sq, d - off + left) if left >= 0 else sq
    return lo, hi


def block_keep(a: int, b: int, c: int, d: int, sq: int, sk: int, left: int, right: int,
                device) -> torch.Tensor | None:
    """Bool (b-a, d-c) mask of rows [a, b) x keys [c, d); None when every pair is kept."""
    off = sk - sq
    full_left = left < 0 or (b - 1) + off - left <= c
    full_right = right < 0 or a + off + right >= d - 1
    if full_left and full_right:
        return None
    i = torch.arange(a, b, device=device).unsqueeze(1) + off
    j = torch.arange(c, d, device=device).unsqueeze(0)
    keep = torch.ones(b - a, d - c, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


@dataclass(frozen=True)
class _Geom:
    """What every block of one dense case needs besides its tensors."""

    sq: int
    sk: int
    left: int
    right: int
    groups: int
    """Query heads per KV head."""
    scale: float
    tiles: tuple | None = None
    """(TileMask, its (Hq, tiles, tiles) keep on the device) of a sliding tile mask, or None."""
    terms: tuple = ()
    """The score features' block terms (``Feature.block_term``), in order."""
    tree: torch.Tensor | None = None
    """(Sq, Sk) bool ``masks.keep_mask`` of a speculative tree (the cache, and the tree among the new tokens), or
    None: Sq is the tree's few tokens, so the whole mask is small."""

    @property
    def modified(self) -> bool:
        return bool(self.terms)


def _geom(q, k, causal, window, scale, tile_mask, feats, dtype, tree=None) -> _Geom:
    hq, hkv = q.shape[2], k.shape[2]
    left, right = mask_bounds(causal, window)
    terms = tuple(t for f in features.FEATURES if f.stage == "score" and f.name in (feats or {})
                  if (t := f.block_term(feats[f.name], hq, hkv, dtype, q.device)) is not None)
    return _Geom(sq=q.shape[1], sk=k.shape[1], left=left, right=right, groups=hq // hkv,
                 scale=q.shape[-1] ** -0.5 if scale is None else scale, tiles=_tiles(tile_mask, hq, q.device),
                 terms=terms,
                 tree=None if tree is None else keep_mask(q.shape[1], k.shape[1], True, device=q.device, tree=tree))


def _row_features(feats) -> list:
    """(feature, its tensor) of the row features among ``feats``."""
    return [(f, feats[f.name]) for f in features.FEATURES if f.stage == "rows" and f.name in (feats or {})]


def _keep(a: int, b: int, c: int, d: int, geom: _Geom, device) -> torch.Tensor | None | bool:
    """The mask of rows [a, b) x keys [c, d): None = all kept, False = none kept (skip the block), else a
    bool (rows, keys) tensor, or (Hq, rows, keys) for a sliding tile mask (each head its own window)."""
    if geom.tree is not None:
        keep = geom.tree[a:b, c:d]
        return None if keep.all() else keep
    if geom.tiles is None:
        return block_keep(a, b, c, d, geom.sq, geom.sk, geom.left, geom.right, device)
    tm, tile_keep = geom.tiles
    keep = tm.block(a, b, c, d, tile_keep.shape[0], device, tile_keep=tile_keep)
    if not keep.any():
        return False
    return None if keep.all() else keep


def _modify_(s: torch.Tensor, a: int, b: int, c: int, d: int, geom: _Geom) -> torch.Tensor | None:
    """The score features' terms, in order, on the scaled scores ``s`` (B·Hkv, G·rows, keys) of rows [a, b) x
    keys [c, d), in place. Returns the product of their derivatives (the chain rule through each term) for the
    backward, or None when every derivative is 1."""
    derivative = None
    box = (a, b, c, d, geom.sq, geom.sk)
    for term in geom.terms:
        local = term.apply_(s, box)
        if local is not None:
            derivative = local if derivative is None else derivative.mul_(local)
    return derivative


def _mask_(s: torch.Tensor, keep: torch.Tensor, groups: int, rows: int) -> None:
    """Set the scores of dropped pairs to -inf in place; ``s`` is (B·Hkv, G·rows, keys), rows group-major."""
    if keep.dim() == 2:
        s.view(s.shape[0], groups, rows, s.shape[-1]).masked_fill_(~keep, -math.inf)
    else:
        heads_kv = keep.shape[0] // groups
        s.view(-1, heads_kv, groups, rows, s.shape[-1]).masked_fill_(
            ~keep.view(heads_kv, groups, rows, keep.shape[-1]), -math.inf)


def _tiles(tile_mask, heads_q: int, device):
    """(TileMask, its (Hq, tiles, tiles) keep on ``device``) or None."""
    return None if tile_mask is None else (tile_mask, tile_mask.tile_keep(heads_q, device))


# ---- layout helpers ---------------------------------------------------------------------------
def _rows(x_bshd: torch.Tensor, a: int, b: int, groups: int, dtype) -> torch.Tensor:
    """Rows [a, b) of a (B, S, Hq, D) tensor as (B·Hkv, G·(b-a), D) in ``dtype`` (group-major rows)."""
    bsz, _, heads, dim = x_bshd.shape
    blk = x_bshd[:, a:b].to(dtype).reshape(bsz, b - a, heads // groups, groups, dim)
    return blk.permute(0, 2, 3, 1, 4).reshape(bsz * (heads // groups), groups * (b - a), dim)


def _keys(x_bshd: torch.Tensor, c: int, d: int, dtype) -> torch.Tensor:
    """Keys [c, d) of a (B, S, Hkv, D) tensor as (B·Hkv, d-c, D) in ``dtype``."""
    bsz, _, heads, dim = x_bshd.shape
    return x_bshd[:, c:d].to(dtype).permute(0, 2, 1, 3).reshape(bsz * heads, d - c, dim)


def _row_block(spec_rows: int, bsz: int, heads_q: int, block_k: int, blocks: BlockSizes) -> int:
    fit = max(1, blocks.max_elems // max(1, bsz * heads_q * block_k))
    return max(1, min(blocks.q, spec_rows, fit))


# ---- forward ----------------------------------------------------------------------------------
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      window: tuple[int, int] | None = None, scale: float | None = None,
                      dtype: torch.dtype | None = None, blocks: BlockSizes | None = None,
                      tile_mask=None, features: dict | None = None, tree: tuple[int, ...] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)) for dense bshd q, k, v, in ``dtype``; ``tile_mask`` is a
    sliding tile mask (``attnbench.sta.TileMask``) applied on top; ``features`` maps the name of each score or
    row feature of the case (``attnbench.features``) to its value (the spec's field for a score feature, its
    input tensor for a row feature: the LSE includes it); ``tree`` is a speculative tree's parents (``serving``),
    with ``causal``."""
    blocks = blocks or BlockSizes()
    dtype = dtype or compute_dtype_for(q.device, q.dtype)
    bsz, sq, hq, _ = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    geom = _geom(q, k, causal, window, scale, tile_mask, features, dtype, tree)
    out = torch.zeros(bsz * hkv, geom.groups, sq, dv, dtype=dtype, device=q.device)
    lse = torch.full((bsz * hkv, geom.groups, sq), -math.inf, dtype=dtype, device=q.device)
    bk = min(blocks.k, sk)
    bq = _row_block(sq, bsz, hq, bk, blocks)
    with exact_fp32_matmul():
        for a in range(0, sq, bq):
            b = min(sq, a + bq)
            lo, hi = _key_range(a, b, sq, sk, geom.left, geom.right)
            if hi <= lo:
                continue  # these rows attend nothing: out 0, lse -inf
            acc, row_lse = _forward_rows(q, k, v, a, b, lo, hi, bk, geom, dtype)
            out[:, :, a:b] = acc.view(bsz * hkv, geom.groups, b - a, dv)
            lse[:, :, a:b] = row_lse.view(bsz * hkv, geom.groups, b - a)
    for feature, tensor in _row_features(features):
        out, lse = feature.rows_forward(out, lse, tensor, dtype)
    out_bshd = out.view(bsz, hq, sq, dv).transpose(1, 2)
    return out_bshd, lse.view(bsz, hq, sq)


def _forward_rows(q, k, v, a, b, lo, hi, bk, geom: _Geom, dtype):
    """Online softmax of rows [a, b) over keys [lo, hi): (acc (BH, G·rows, Dv), lse (BH, G·rows))."""
    q_blk = _rows(q, a, b, geom.groups, dtype) * geom.scale  # never in place: _rows may return a view of q
    rows = q_blk.shape[1]
    m = torch.full(q_blk.shape[:2], -math.inf, dtype=dtype, device=q.device)
    l_sum = torch.zeros_like(m)
    acc = torch.zeros(q_blk.shape[0], rows, v.shape[3], dtype=dtype, device=q.device)
    for c in range(lo, hi, bk):
        d = min(hi, c + bk)
        keep = _keep(a, b, c, d, geom, q.device)
        if keep is False:
            continue
        k_blk, v_blk = _keys(k, c, d, dtype), _keys(v, c, d, dtype)
        s = torch.bmm(q_blk, k_blk.transpose(1, 2))
        if geom.modified:
            _modify_(s, a, b, c, d, geom)
        if keep is not None:
            _mask_(s, keep, geom.groups, b - a)
        m_new = torch.maximum(m, s.amax(dim=-1))
        # A row with no key kept so far has m_new = -inf: subtract 0 instead (exp(-inf) = 0, not NaN).
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = s.sub_(m_safe.unsqueeze(-1)).exp_()
        corr = torch.exp(m - m_safe)
        l_sum.mul_(corr).add_(p.sum(dim=-1))
        acc.mul_(corr.unsqueeze(-1)).baddbmm_(p, v_blk)
        m = m_new
        del s, p
    empty = l_sum == 0
    acc.div_(torch.where(empty, torch.ones_like(l_sum), l_sum).unsqueeze(-1))
    lse = torch.where(empty, torch.full_like(m, -math.inf), m + torch.log(l_sum))
    return acc, lse


# ---- backward ---------------------------------------------------------------------------------
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       dout: torch.Tensor, *, causal: bool = False, window: tuple[int, int] | None = None,
                       scale: float | None = None, dtype: torch.dtype | None = None,
                       blocks: BlockSizes | None = None, tile_mask=None, features: dict | None = None,
                       tree: tuple[int, ...] | None = None) -> dict[str, torch.Tensor]:
    """Exact ``{"dq", "dk", "dv"}`` in the bshd shapes of q, k, v, given the exact ``out`` and ``lse``, and the
    gradient of each row feature's input (``d`` + its name; ``features`` as in ``attention_forward``)."""
    blocks = blocks or BlockSizes()
    dtype = dtype or compute_dtype_for(q.device, q.dtype)
    bsz, sq, hq, dim = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    geom = _geom(q, k, causal, window, scale, tile_mask, features, dtype, tree)
    groups = geom.groups
    # Rows with no key have lse = -inf; +inf makes exp(s - lse) = 0 there instead of NaN.
    lse_g = torch.where(torch.isinf(lse), torch.full_like(lse, math.inf), lse).to(dtype)
    lse_g = lse_g.view(bsz * hkv, groups, sq)
    dq = torch.zeros(bsz * hkv, groups, sq, dim, dtype=dtype, device=q.device)
    dk = torch.zeros(bsz * hkv, sk, dim, dtype=dtype, device=q.device)
    dv = torch.zeros(bsz * hkv, sk, v.shape[3], dtype=dtype, device=q.device)
    bk = min(blocks.k, sk)
    bq = _row_block(sq, bsz, hq, bk, blocks)
    with exact_fp32_matmul():
        for c in range(0, sk, bk):
            d = min(sk, c + bk)
            lo, hi = _query_range(c, d, sq, sk, geom.left, geom.right)
            k_blk, v_blk = _keys(k, c, d, dtype), _keys(v, c, d, dtype)
            for a in range(lo, hi, bq):
                b = min(hi, a + bq)
                dq_blk = _backward_block(q, dout, out, lse_g, k_blk, v_blk, dk[:, c:d], dv[:, c:d],
                                         (a, b, c, d), geom, dtype)
                dq[:, :, a:b] += dq_blk.view(bsz * hkv, groups, b - a, dim)
    grads = {"dq": dq.view(bsz, hq, sq, dim).transpose(1, 2), "dk": dk.view(bsz, hkv, sk, dim).transpose(1, 2),
             "dv": dv.view(bsz, hkv, sk, v.shape[3]).transpose(1, 2)}
    for feature, tensor in _row_features(features):
        grads[grad_name(feature.name)] = feature.rows_grad(out, dout, lse, tensor, dtype, bq)
    return grads


def _backward_block(q, dout, out, lse_g, k_blk, v_blk, dk_blk, dv_blk, box, geom: _Geom, dtype):
    """One (rows, keys) tile: accumulates into dk_blk / dv_blk in place, returns this tile's dQ part."""
    a, b, c, d = box
    groups, scale = geom.groups, geom.scale
    keep = _keep(a, b, c, d, geom, q.device)
    if keep is False:
        return torch.zeros(k_blk.shape[0], groups * (b - a), q.shape[-1], dtype=dtype, device=q.device)
    q_blk = _rows(q, a, b, groups, dtype) * scale  # scale folded into Q: S and dK both need it
    do_blk = _rows(dout, a, b, groups, dtype)
    o_blk = _rows(out, a, b, groups, dtype)
    delta = (do_blk * o_blk).sum(dim=-1, keepdim=True)
    del o_blk
    neg_lse = -lse_g[:, :, a:b].reshape(lse_g.shape[0], -1, 1)
    dcap = None
    if geom.modified:  # the scores themselves first, then - lse
        p = torch.bmm(q_blk, k_blk.transpose(1, 2))
        dcap = _modify_(p, a, b, c, d, geom)
        p.add_(neg_lse)
    else:
        p = torch.baddbmm(neg_lse, q_blk, k_blk.transpose(1, 2))
    if keep is not None:
        _mask_(p, keep, groups, b - a)
    p.exp_()
    dv_blk.baddbmm_(p.transpose(1, 2), do_blk)
    ds = torch.bmm(do_blk, v_blk.transpose(1, 2)).sub_(delta).mul_(p)
    del p
    if dcap is not None:  # through the score terms (the chain rule: the product of their derivatives)
        ds.mul_(dcap)
    dk_blk.baddbmm_(ds.transpose(1, 2), q_blk)
    return torch.bmm(ds, k_blk).mul_(scale)


# ---- whole cases --------------------------------------------------------------------------------
def reference_attention(spec: AttnSpec, inputs: AttnInputs, *, grads: bool = True,
                        dtype: torch.dtype | None = None, blocks: BlockSizes | None = None) -> Reference:
    """Exact outputs of ``spec`` on ``inputs`` (on the inputs' device); gradients use ``inputs.dout``."""
    dtype = dtype or compute_dtype_for(inputs.q.device, inputs.q.dtype)
    active = features.active(spec)
    feats = {f.name: (getattr(spec, f.name) if f.stage == "score" else inputs.extra[f.name].detach())
             for f in active if f.stage != "output"}
    kw = dict(causal=spec.causal, window=spec.window, scale=spec.softmax_scale, dtype=dtype, blocks=blocks,
              tile_mask=spec.sta, features=feats, tree=spec.tree)
    after = [(f, inputs.extra[f.name].detach()) for f in active if f.stage == "output"]
    dout = inputs.dout
    for feature, tensor in reversed(after) if grads else ():  # the dO attention sees behind the output features
        dout = feature.output_dout(dout, tensor, dtype)
    ref = _attention(inputs, dout, grads, kw, dtype) if inputs.varlen else \
        _dense_case(inputs.q, inputs.k, inputs.v, dout, grads, kw)
    for feature, tensor in after:
        out_attn = ref.out
        ref.out = feature.output(out_attn, tensor)
        if grads:
            ref[grad_name(feature.name)] = feature.output_grad(out_attn, inputs.dout, tensor, dtype)
    return ref


def _attention(inputs: AttnInputs, dout, grads: bool, kw: dict, dtype) -> Reference:
    """A grouped case, a request at a time (a shared prefix in front of each request's own keys)."""
    q, k, v = inputs.q, inputs.k, inputs.v
    ref = Reference(out=q.new_zeros(q.shape[0], q.shape[1], v.shape[2], dtype=dtype),
                    lse=q.new_full((q.shape[1], q.shape[0]), -math.inf, dtype=dtype))
    if grads and inputs.prefix_k is not None:
        raise ValueError("a shared prefix is forward only: no reference gradients")
    for (a, b), (c, d) in inputs.bounds():
        k_i, v_i = inputs.request_kv(c, d)
        part = _dense_case(q[None, a:b], k_i[None], v_i[None], dout[None, a:b], grads, kw)
        ref.out[a:b], ref.lse[:, a:b] = part.out[0], part.lse[0]
        if not grads:
            continue
        for name, grad in part.tensors().items():
            if name in ("out", "lse"):
                continue
            if name not in ref:  # q rows and k/v rows by request; a per-head input's gradient adds up
                like = {"dq": q, "dk": k, "dv": v}.get(name)
                ref[name] = torch.zeros_like(grad if like is None else like, dtype=dtype)
            if name == "dq":
                ref.dq[a:b] = grad[0]
            elif name in ("dk", "dv"):
                ref[name][c:d] = grad[0]
            else:
                ref[name] += grad
    return ref


def _dense_case(q, k, v, dout, grads: bool, kw: dict) -> Reference:
    out, lse = attention_forward(q, k, v, **kw)
    ref = Reference(out=out, lse=lse)
    if grads:
        for name, grad in attention_backward(q, k, v, out, lse, dout, **kw).items():
            ref[name] = grad
    return ref


class _ExactAttention(torch.autograd.Function):
    """Differentiable wrapper (compute dtype = input dtype), mainly for gradcheck and reuse."""

    @staticmethod
    def forward(ctx, q, k, v, causal, window, scale, blocks):
        kw = dict(causal=causal, window=window, scale=scale, dtype=q.dtype, blocks=blocks)
        out, lse = attention_forward(q, k, v, **kw)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kw = kw
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        grads = attention_backward(q, k, v, out, lse, dout, **ctx.kw)
        return grads["dq"], grads["dk"], grads["dv"], None, None, None, None


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    window: tuple[int, int] | None = None, scale: float | None = None,
                    blocks: BlockSizes | None = None) -> torch.Tensor:
    """Differentiable exact attention of dense bshd tensors, computed in their own dtype."""
    return _ExactAttention.apply(q, k, v, causal, window, scale, blocks)

"""``torch-cp-flex``: torch's native context parallel on its FlexAttention path, with the document mask.

torch's SDPA context parallel (``torch-cp``, ``peers.py``) takes no mask, so packed documents cannot run on it;
its FlexAttention path takes a ``BlockMask``. The path is private in torch 2.11 (read there, and unchanged in
2.13), in ``torch.distributed.tensor.experimental._context_parallel``:

- ``_ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)``, applied with
  ``parallelize_module`` to a module that calls the compiled ``flex_attention``: a forward pre-hook all-gathers K
  and V over the mesh (``flex_cp_allgather``, whose backward reduce-scatters dK and dV), and each rank's queries
  attend to the whole sequence under the rank's share of the block mask;
- ``_create_cp_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device_mesh, load_balancer)``: that share, from a
  ``mask_mod`` written in global positions (torch rewrites it for the rank's rows and the balancer's order); it
  needs ``Q_LEN`` to be a multiple of ``128 x world`` (FlexAttention's sparse block on every rank);
- ``_PerDocumentHeadTailLoadBalancer(lengths, world, device)``: each document cut into ``2 x world`` chunks,
  rank i holding chunks i and ``2 x world - 1 - i`` of every document; it needs every document's length to be
  a multiple of ``2 x world``. When one is not (``--documents``' long-tailed lengths mostly are not), the
  sequence is balanced as one by ``_HeadTailLoadBalancer`` (the zigzag layout) and the record says why.

What runs: this module does what torch's own test does (``test/distributed/tensor/test_attention.py``,
``CPFlexAttentionTest``): ``torch.compile(flex_attention, dynamic=False, fullgraph=True)`` inside the hooked
module, the mask of ``documents.py``'s documents (causal within each when the case is causal). The harness
shards the inputs itself at the balancer's positions (the same ``index_select`` torch's sharding does), so
``bench.py``'s check and timing run unchanged. The block mask is built and both compiled graphs (with and
without gradients) are primed when the method's context is entered, before the check and the timed calls.
The single-device result of the check is the same compiled FlexAttention on the full sequence with the full
block mask; the exact result is ``documents.exact``, as for every document method.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import dataclass, field

import torch

from attnbench.distributed import layout as lay
from attnbench.distributed.peers import PeerUnavailable, _need_cuda

WHAT = "torch native context parallel with FlexAttention (torch-cp-flex)"
MIN_TORCH = (2, 11)
"""The first torch whose private FlexAttention context parallel this module was read against (2.10 has the
names, but its hook takes the block mask by position)."""
FLEX_BLOCK = 128
"""FlexAttention's sparse block (``flex_attention._DEFAULT_SPARSE_BLOCK_SIZE``): every rank's rows are whole
blocks, so a length must be a multiple of ``FLEX_BLOCK x world``."""
RECOMPILE_LIMIT = 1024
"""Compiled graphs dynamo keeps per function while the method runs: each case has its own block mask (its
documents' closure) and one graph with and one without gradients, plus the full-length reference; beyond
dynamo's default 8 it would fall back to eager FlexAttention, which builds the S x S scores."""
_CP = "torch.distributed.tensor.experimental._context_parallel"
NAMES = {
    f"{_CP}._attention": ("_ContextParallel", "_create_cp_block_mask"),
    f"{_CP}._load_balancer": ("_HeadTailLoadBalancer", "_PerDocumentHeadTailLoadBalancer"),
    "torch.nn.attention.flex_attention": ("flex_attention", "create_block_mask"),
    "torch.distributed.tensor.parallel": ("parallelize_module",),
    "torch.distributed.device_mesh": ("init_device_mesh",),
    "torch._dynamo.config": ("recompile_limit",),
}
"""The torch names this peer uses, by module (torch 2.11)."""


def torch_api(version: str | None = None) -> dict[str, object]:
    """The names of ``NAMES`` (and ``_ContextParallel.AttentionType.FLEX``) by name; PeerUnavailable, one line
    naming what is missing, when torch is older than ``MIN_TORCH`` or lacks any of them."""
    version = version or torch.__version__
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or tuple(map(int, found.groups())) < MIN_TORCH:
        raise PeerUnavailable(f"torch-cp-flex needs torch >= {'.'.join(map(str, MIN_TORCH))} (torch's private "
                              f"context-parallel FlexAttention path, as read there); this is torch {version}")
    api, missing = {}, []
    for module, names in NAMES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            missing += [f"{module}.{name}" for name in names]
            continue
        for name in names:
            if hasattr(mod, name):
                api[name] = getattr(mod, name)
            else:
                missing.append(f"{module}.{name}")
    style = api.get("_ContextParallel")
    if style is not None and not hasattr(getattr(style, "AttentionType", None), "FLEX"):
        missing.append(f"{_CP}._attention._ContextParallel.AttentionType.FLEX")
    if missing:
        raise PeerUnavailable(f"torch {version} lacks what torch-cp-flex uses (private names of torch 2.11): "
                              f"{', '.join(missing)}")
    return api


def check_seq_len(seq_len: int, world: int) -> None:
    """ValueError with the nearest valid lengths unless every rank's rows are whole FlexAttention blocks."""
    # a contiguous layout over FLEX_BLOCK x world "ranks" is exactly that rule, with the same message
    lay.check_seq_len(seq_len, "contiguous", FLEX_BLOCK * world,
                      what=f"torch-cp-flex: FlexAttention's {FLEX_BLOCK}-row blocks x world size {world}")


def document_ids(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 ``(sum(lengths),)``: the index of the document each packed position belongs to."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32, device=device), counts)


def document_mask_mod(lengths: tuple[int, ...], causal: bool, device: torch.device | str = "cpu"):
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` in global positions: True where the query and the key are
    in the same document (and the key does not follow the query, when causal). Within one document global order
    is the document's own, so the plain ``q_idx >= kv_idx`` is its causal mask."""
    ids = document_ids(lengths, device)

    def mask_mod(b, h, q_idx, kv_idx):
        same = ids[q_idx] == ids[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    return mask_mod


def load_balancer(api: dict, lengths: tuple[int, ...], world: int, device) -> tuple[object, str, str | None]:
    """(torch's balancer, its name, why not per document or None): per document when there are several documents
    and every length is a multiple of ``2 x world``, else head-tail over the whole sequence."""
    if len(lengths) > 1 and all(n % (2 * world) == 0 for n in lengths):
        return api["_PerDocumentHeadTailLoadBalancer"]([list(lengths)], world, device), \
            "_PerDocumentHeadTailLoadBalancer", None
    why = None if len(lengths) == 1 else (f"not every document's length is a multiple of 2 x world size "
                                          f"({2 * world}), which the per-document balancer needs")
    return api["_HeadTailLoadBalancer"](sum(lengths), world, device), "_HeadTailLoadBalancer", why


def rank_positions(balancer, rank: int, world: int) -> torch.Tensor:
    """int64 global positions ``rank`` holds, in local order: torch rearranges the sequence by the balancer's
    indices and gives rank i the i-th of ``world`` equal contiguous pieces (``_context_parallel_buffers``).

    So torch 2.11's per-document balancer, which orders document by document (each document's chunks of rank
    0, then of rank 1, ...), leaves most documents whole on one rank, unlike the rank-by-rank picture of its
    docstring: ``pairs_per_rank`` says how even the work came out."""
    order = balancer._generate_indices(restore=False)[0].to("cpu", torch.int64)
    share = len(order) // world
    return order[rank * share:(rank + 1) * share].clone()


def pairs_per_rank(lengths: tuple[int, ...], causal: bool, positions: list[torch.Tensor]) -> list[int]:
    """(query, key) pairs the queries of each rank's ``positions`` attend under the document mask: its work."""
    ids = document_ids(lengths).long()
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    pos = torch.arange(len(ids))
    pairs = pos - starts[ids] + 1 if causal else torch.tensor(lengths)[ids]
    return [int(pairs[p].sum()) for p in positions]


class _FlexAttention(torch.nn.Module):
    """What torch's FLEX context-parallel style hooks: (q, k, v) bhsd -> the compiled ``flex_attention``."""

    def __init__(self, compiled) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, query, key, value, **kwargs):
        return self.compiled(query, key, value, **kwargs)


@dataclass(kw_only=True)
class FlexPeer:
    """A ready torch-cp-flex: what ``bench.Method`` needs."""

    fn: object
    """(q, k, v) local bshd shards -> local output shard (differentiable)."""
    context: object
    """Factory of the context the calls run in: builds the block mask and primes the compiled graphs."""
    reference: object
    """(q, k, v, dout) full bshd -> out, dq, dk, dv of the same FlexAttention on one device."""
    positions: torch.Tensor
    """int64 global positions this rank holds, in local order."""
    layout: str
    info: dict = field(default_factory=dict)


def torch_cp_flex(*, spec, device: torch.device, rank: int, world: int) -> FlexPeer:
    """torch's FlexAttention context parallel for ``spec`` (its documents, or one sequence) on ``world`` ranks."""
    _need_cuda(device, WHAT)
    api = torch_api()
    lengths = tuple(spec.seqlens_q)
    seq = sum(lengths)  # a multiple of FLEX_BLOCK x world (check_seq_len, before any rank builds)
    mesh = api["init_device_mesh"](device.type, (world,))
    balancer, balancer_name, why = load_balancer(api, lengths, world, device)
    mask_mod = document_mask_mod(lengths, spec.causal, device)
    compiled = torch.compile(api["flex_attention"], dynamic=False, fullgraph=True)
    module = _FlexAttention(compiled)
    style = api["_ContextParallel"]
    api["parallelize_module"](module, mesh, style(seq_dim=2, attention_type=style.AttentionType.FLEX))
    gqa = spec.heads_q != spec.heads_kv
    state = {}

    def fn(q, k, v):
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        out = module(qh, kh, vh, block_mask=state["block_mask"], scale=spec.softmax_scale, enable_gqa=gqa)
        return out.transpose(1, 2)

    @contextlib.contextmanager
    def context():
        with torch._dynamo.config.patch(recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
            state["block_mask"] = api["_create_cp_block_mask"](
                mask_mod=mask_mod, B=1, H=1, Q_LEN=seq, KV_LEN=seq, device_mesh=mesh, load_balancer=balancer)
            _prime(fn, spec, seq // world, device)
            try:
                yield
            finally:
                state.clear()

    def reference(q, k, v, dout):
        block_mask = torch.compile(api["create_block_mask"], dynamic=False, fullgraph=True)(
            mask_mod, 1, 1, seq, seq, device=device)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = compiled(*(t.transpose(1, 2) for t in leaves), block_mask=block_mask, scale=spec.softmax_scale,
                       enable_gqa=gqa).transpose(1, 2)
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
        return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}

    everyone = [rank_positions(balancer, r, world) for r in range(world)]
    work = pairs_per_rank(lengths, spec.causal, everyone)
    info = {"peer": f"{_CP}._ContextParallel (AttentionType.FLEX)", "kernel": "flex_attention (torch.compile)",
            "load_balancer": balancer_name, "pairs_per_rank": work,
            "imbalance": round(max(work) * world / sum(work), 4), "gqa": "enable_gqa" if gqa else "none",
            "torch": torch.__version__}
    if why:
        info["load_balancer_why"] = why
    layout = "per-document head-tail" if balancer_name.startswith("_PerDocument") else "zigzag"
    return FlexPeer(fn=fn, context=context, reference=reference, positions=everyone[rank], layout=layout, info=info)


def _prime(fn, spec, local_len: int, device: torch.device) -> None:
    """One call with gradients and one without on seeded random shards of the local shape: compiles both graphs
    (and runs the collectives once) before anything is checked or timed. Every rank calls it together."""
    gen = torch.Generator(device=device).manual_seed(0)

    def draw(heads, dim):
        return torch.randn(spec.batch, local_len, heads, dim, generator=gen, device=device, dtype=spec.torch_dtype)

    q, k, v = draw(spec.heads_q, spec.head_dim), draw(spec.heads_kv, spec.head_dim), draw(spec.heads_kv, spec.head_dim_v)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    fn(*leaves).backward(draw(spec.heads_q, spec.head_dim_v))
    with torch.no_grad():
        fn(q, k, v)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""USP (unified sequence parallelism): Ulysses inside groups of U contiguous ranks, ring across them.

World = U x R. Global rank g = ring_rank * U + ulysses_rank, so a Ulysses group is U neighbouring
ranks (the same node, the fast links, for the all-to-all) and a ring group is the ranks with the
same Ulysses index, one per node. The sequence is laid out for the ring first (zigzag over R for
causal, contiguous otherwise) and each ring shard is split contiguously over its Ulysses group
(layout.positions with ``ulysses_degree=U``). After the all-to-all every rank holds its ring shard
whole, in order, for H/U heads; ring attention runs on that over the ring group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnbench.distributed.kernels import LocalKernel, local_attention
from attnbench.distributed.ring import ring_attention
from attnbench.distributed.ulysses import ulysses_attention


@dataclass(frozen=True, kw_only=True)
class Mesh2D:
    """Process groups of a U x R mesh, as seen from this rank."""

    ulysses_degree: int
    """U: ranks per Ulysses (all-to-all) group."""
    ring_degree: int
    """R: ranks per ring group."""
    ulysses_group: object
    """This rank's Ulysses group (None when the whole world is one group)."""
    ring_group: object
    """This rank's ring group (None when the whole world is one group)."""


def make_mesh(ulysses_degree: int) -> Mesh2D:
    """Create the groups (every rank must call this, in the same order)."""
    world = dist.get_world_size()
    if ulysses_degree < 1 or world % ulysses_degree:
        raise ValueError(f"--ulysses-degree {ulysses_degree} must divide the world size {world}")
    ring_degree = world // ulysses_degree
    rank = dist.get_rank()
    ulysses_group = ring_group = None
    # new_group is collective: every rank creates every group, keeps its own.
    for r in range(ring_degree):
        ranks = list(range(r * ulysses_degree, (r + 1) * ulysses_degree))
        g = dist.new_group(ranks) if 1 < ulysses_degree < world else None
        if rank in ranks:
            ulysses_group = g
    for u in range(ulysses_degree):
        ranks = list(range(u, world, ulysses_degree))
        g = dist.new_group(ranks) if 1 < ring_degree < world else None
        if rank in ranks:
            ring_group = g
    if ulysses_degree == world:
        ulysses_group = None
    if ring_degree == world:
        ring_group = None
    return Mesh2D(ulysses_degree=ulysses_degree, ring_degree=ring_degree, ulysses_group=ulysses_group,
                  ring_group=ring_group)


def usp_attention(q, k, v, *, kernel: LocalKernel, causal: bool, scale: float, mesh: Mesh2D,
                  comm: str = "p2p") -> torch.Tensor:
    """Attention of USP-layout shards (see the module doc); returns the local output shard."""
    zigzag = causal

    def ring(qh, kh, vh):
        if mesh.ring_degree == 1:  # pure Ulysses: the gathered sequence is complete
            return local_attention(qh, kh, vh, kernel, causal, scale)
        return ring_attention(qh, kh, vh, kernel=kernel, causal=causal, scale=scale, group=mesh.ring_group,
                              layout="zigzag" if zigzag else "contiguous", comm=comm)

    if mesh.ulysses_degree == 1:
        return ring(q, k, v)
    return ulysses_attention(q, k, v, kernel=kernel, causal=causal, scale=scale, group=mesh.ulysses_group,
                             inner=ring)


"""Which sequence positions each rank holds, and checks that a length splits evenly.

Layouts (sequence dim 1 of bshd tensors):

- ``contiguous``: rank i holds chunk i of ``world`` equal chunks (ring, Ulysses).
- ``zigzag``: the sequence is cut into ``2 * world`` chunks; rank i holds chunks i and
  ``2 * world - 1 - i``, so every rank has the same amount of causal work.
- USP nests the two: the ring layout over the ``R`` ring ranks first, then each ring shard is split
  contiguously over the ``U`` ranks of its Ulysses group (global rank = ring_rank * U + ulysses_rank).

Lengths that do not split are rejected, not padded: padded keys would have to be masked, which the
local kernels (full or diagonal-causal blocks only) cannot do, and padding would change the problem
that is being timed.
"""

from __future__ import annotations

import math

import torch

LAYOUTS = ("contiguous", "zigzag")


def natural_block(layout: str, world: int, ulysses_degree: int = 1) -> int:
    """Smallest number that the total sequence length must be a multiple of."""
    ring = world // ulysses_degree
    if layout == "zigzag":
        return math.lcm(2 * ring, ring * ulysses_degree)
    return world


def check_seq_len(seq_len: int, layout: str, world: int, ulysses_degree: int = 1, what: str = "") -> None:
    """ValueError with the nearest valid lengths if ``seq_len`` does not split into the layout."""
    block = natural_block(layout, world, ulysses_degree)
    if seq_len % block:
        lo, hi = seq_len // block * block, (seq_len // block + 1) * block
        near = f"{lo} or {hi}" if lo else f"{hi}"
        why = what or f"{layout} layout over {world} ranks"
        raise ValueError(f"sequence length {seq_len} is not a multiple of {block} ({why}); "
                         f"lengths are not padded: use e.g. {near}")


def positions(seq_len: int, layout: str, rank: int, world: int, ulysses_degree: int = 1) -> torch.Tensor:
    """int64 indices of the global sequence positions held by ``rank``, in local order."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; allowed: {', '.join(LAYOUTS)}")
    check_seq_len(seq_len, layout, world, ulysses_degree)
    ring_rank, sub_rank = divmod(rank, ulysses_degree)
    ring_part = torch.cat([torch.arange(a, b) for a, b in runs(seq_len, layout, ring_rank, world // ulysses_degree)])
    return ring_part.chunk(ulysses_degree)[sub_rank].clone()


def runs(seq_len: int, layout: str, rank: int, world: int) -> tuple[tuple[int, int], ...]:
    """The global [start, end) runs of positions ``rank`` of a ring of ``world`` holds, in local order (one for
    ``contiguous``, two for ``zigzag``)."""
    if layout == "zigzag":
        c = seq_len // (2 * world)
        return ((rank * c, (rank + 1) * c), ((2 * world - 1 - rank) * c, (2 * world - rank) * c))
    c = seq_len // world
    return ((rank * c, (rank + 1) * c),)


def shard(x: torch.Tensor, idx: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The positions ``idx`` of ``x`` along ``dim`` (a contiguous copy)."""
    return x.index_select(dim, idx.to(x.device)).contiguous()


def unshard(shards: list[torch.Tensor], indices: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of ``shard`` over all ranks: put every rank's shard back at its positions."""
    total = sum(len(i) for i in indices)
    shape = list(shards[0].shape)
    shape[dim] = total
    out = shards[0].new_empty(shape)
    for part, idx in zip(shards, indices, strict=True):
        out.index_copy_(dim, idx.to(out.device), part)
    return out


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s zigzag shard (chunks rank and 2*world-1-rank) of a full sequence."""
    return shard(x, positions(x.shape[dim], "zigzag", rank, world), dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's zigzag shard, in rank order."""
    world = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    return unshard(shards, [positions(seq_len, "zigzag", r, world) for r in range(world)], dim)

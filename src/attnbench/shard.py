"""One sweep over many GPUs: deterministic case splitting, per-rank devices and per-rank DB files.

Under ``torchrun --nproc_per_node N -m attnbench run ...`` (or ``--shard I/N`` by hand) every process
expands the same sweep, keeps its share of the cases, runs them on its own GPU and writes its own
SQLite file; ``attnbench merge`` joins the files afterwards. Several processes never write one file.

Cases are split by whole shapes (every pass, causal setting and backend of one input shape stays on one
rank, so inputs are built once), balancing the estimated FLOPs: the biggest shapes are handed out first,
each to the rank with the least work so far (ties to the lowest rank). The split depends only on the
case list and N, so every rank computes the same one without talking to the others.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from attnbench import operators
from attnbench.spec import AttnSpec

log = logging.getLogger(__name__)

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True, kw_only=True)
class Shard:
    """This process's share of a sweep."""

    index: int
    """0-based shard (rank) number."""
    count: int
    """Number of shards (world size)."""
    local_rank: int | None = None
    """GPU index on this host under torchrun; None when sharding by hand."""

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"bad shard {self.index}/{self.count}: need 0 <= I < N (e.g. --shard 0/4)")

    @property
    def active(self) -> bool:
        return self.count > 1


def parse(text: str) -> Shard:
    """``"I/N"`` -> Shard(index=I, count=N); ValueError with the expected form otherwise."""
    m = _SHARD.match(str(text))
    if not m:
        raise ValueError(f"bad --shard {text!r}: give I/N, e.g. 0/4 for the first of four shards")
    return Shard(index=int(m.group(1)), count=int(m.group(2)))


def env_int(name: str, default: int, environ: dict | None = None, *, low: int = 0) -> int:
    """An integer that torchrun puts in the environment (RANK, WORLD_SIZE, LOCAL_RANK); ValueError naming the
    variable when it is not one, or below ``low``."""
    env = os.environ if environ is None else environ
    text = env.get(name)
    if text is None or not str(text).strip():
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"bad {name}={str(text)[:40]!r} in the environment: torchrun sets it to an integer "
                         f">= {low}; unset it, or run under torchrun")
    return value


def from_env(environ: dict | None = None) -> Shard | None:
    """The shard torchrun describes (RANK / WORLD_SIZE / LOCAL_RANK), or None outside torchrun; ValueError for
    values that are not torchrun's."""
    world = env_int("WORLD_SIZE", 1, environ, low=1)
    if world <= 1:
        return None
    rank = env_int("RANK", env_int("LOCAL_RANK", 0, environ), environ)
    if rank >= world:
        raise ValueError(f"bad RANK={rank} in the environment: WORLD_SIZE is {world}, so ranks are 0..{world - 1}")
    return Shard(index=rank, count=world, local_rank=env_int("LOCAL_RANK", rank, environ))


def _cost(spec: AttnSpec) -> float:
    return operators.of(spec).flops(spec, convention="dense")


def assign(specs: list[AttnSpec], count: int) -> list[int]:
    """Shard index of every spec (same order as ``specs``); whole shapes stay together."""
    groups: dict[tuple, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(spec.shape_key(), []).append(i)
    weights = [(sum(_cost(specs[i]) for i in members), order) for order, members in enumerate(groups.values())]
    load = [0.0] * count
    owner = [0] * len(specs)
    members_list = list(groups.values())
    for weight, order in sorted(weights, key=lambda w: (-w[0], w[1])):
        target = min(range(count), key=lambda r: (load[r], r))
        load[target] += weight
        for i in members_list[order]:
            owner[i] = target
    return owner


def select(specs: list[AttnSpec], shard: Shard | None) -> list[AttnSpec]:
    """The specs of ``shard``, in their original (shape-major) order."""
    if shard is None or not shard.active:
        return list(specs)
    owner = assign(specs, shard.count)
    return [s for s, o in zip(specs, owner, strict=True) if o == shard.index]


def db_path(db: Path, shard: Shard | None) -> Path:
    """Per-shard DB file: ``{rank}`` in the name is replaced, else ``name.rankI.db``."""
    if shard is None or not shard.active:
        return Path(str(db).replace("{rank}", "0")) if "{rank}" in str(db) else db
    if "{rank}" in str(db):
        return Path(str(db).replace("{rank}", str(shard.index)))
    return db.with_name(f"{db.stem}.rank{shard.index}{db.suffix or '.db'}")


def device_for(device: str, shard: Shard | None) -> str:
    """``cuda`` (no index) becomes ``cuda:LOCAL_RANK`` under torchrun; anything else is kept."""
    if shard is not None and shard.local_rank is not None and device == "cuda":
        return f"cuda:{shard.local_rank}"
    return device


def shared_run_id(shard: Shard | None, run_id: str | None, make_id) -> str:
    """One run id for every rank: the given one, else rank 0's new id sent to all ranks.

    Sharding by hand (no torchrun rendezvous) needs an explicit id; under torchrun rank 0 makes one and
    broadcasts it over a short-lived gloo (CPU) process group.
    """
    if run_id:
        return run_id
    if shard is None or not shard.active:
        return make_id()
    launcher = from_env()  # the processes torchrun started (not necessarily the shards)
    if launcher is None or "MASTER_ADDR" not in os.environ:
        raise ValueError("--shard needs --run-id so that every shard writes the same run "
                         "(e.g. --run-id sweep-$(date +%Y%m%d-%H%M%S)); under torchrun it is chosen for you")
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=launcher.index, world_size=launcher.count)
    try:
        box = [make_id() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
    finally:
        if owned:
            dist.destroy_process_group()
    log.info("rank %d uses run id %s", shard.index, box[0])
    return str(box[0])

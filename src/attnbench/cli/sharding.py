"""`attnbench run --shard I/N --run-id ID` and torchrun: narrow a RunPlan to this process's share."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from attnbench import shard as shardmod
from attnbench.cli.common import UserError, shown
from attnbench.results.store import ResultStore, check_run_id, new_run_id

ShardOpt = Annotated[str | None, typer.Option(
    "--shard", rich_help_panel="Run control", help="Run only shard I of N (I/N) of the sweep, into its own DB file; set by torchrun too.")]
RunIdOpt = Annotated[str | None, typer.Option(
    "--run-id", rich_help_panel="Run control", help="Id of the new run (default: time + random); shards of one sweep share it.")]


def resolve(shard_text: str | None) -> shardmod.Shard | None:
    """--shard wins over torchrun's environment; None when the sweep is not split."""
    try:
        part = shardmod.parse(shard_text) if shard_text else shardmod.from_env()
        if part is not None and shard_text:
            env = shardmod.from_env()
            if env is not None:  # --shard under torchrun: keep the GPU mapping of the launcher
                part = dataclasses.replace(part, local_rank=env.local_rank)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return part


def apply(plan, shard_text: str | None, run_id: str | None):
    """(plan narrowed to this shard, run id, merge hint or None). The run id must be new in the DB file."""
    part = resolve(shard_text)
    if run_id is not None:
        try:
            check_run_id(run_id)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    template = plan.db
    db = shardmod.db_path(plan.db, part)
    device = shardmod.device_for(plan.options.device, part)
    output = shardmod.db_path(plan.output, part) if plan.output is not None else None
    plan = dataclasses.replace(plan, specs=shardmod.select(plan.specs, part), db=db, output=output,
                               options=dataclasses.replace(plan.options, device=device))
    try:
        run_id = shardmod.shared_run_id(part, run_id, new_run_id)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if db.exists():
        with ResultStore(db, readonly=True) as store:
            if store.run(run_id) is not None:
                raise UserError(f"run {run_id} already exists in {db}; choose another --run-id")
    return plan, run_id, merge_hint(template, part)



def resumed(plan):
    """(plan, run id, None) for ``--resume``: the stored sweep narrowed to the shard it was started with (a
    resumed shard runs only its own missing cases), written to the file given."""
    stored = plan.config.get("shard")
    if stored:
        try:
            part = shardmod.parse(str(stored))
        except ValueError as exc:
            raise UserError(f"run {plan.resume}: stored --shard {shown(stored)}: {exc}") from None
        plan = dataclasses.replace(plan, specs=shardmod.select(plan.specs, part))
    return plan, plan.resume, None


def merge_hint(db_template, part: shardmod.Shard | None) -> str | None:
    """What to run once every shard is done (printed by rank 0)."""
    if part is None or not part.active:
        return None
    files = " ".join(str(shardmod.db_path(db_template, dataclasses.replace(part, index=i))) for i in range(part.count))
    return f"shard {part.index}/{part.count} done; when all are: attnbench merge MERGED.db {files}"


def rank() -> int:
    """This process's rank under torchrun (0 otherwise); UserError for values that are not torchrun's."""
    try:
        part = shardmod.from_env()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return 0 if part is None else part.index

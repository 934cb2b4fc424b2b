"""`attnbench links`: peer bandwidth and latency between the GPUs of a torchrun job, at the sizes the
context-parallel methods send; `attnbench cp-model --links FILE` takes the result instead of fitted values.

    torchrun --nproc_per_node 2 -m attnbench links --output links.json
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.results.files import check_output, write_text_atomic

MAX_MIB = 4096
"""The largest message measured (sizes go up by 4x from 4 KiB to 4 GiB)."""


def links(
    output: Annotated[Path | None, typer.Option("--output", help="Write the measurements and the fit to FILE.json.")] = None,
    max_mib: Annotated[int, typer.Option("--max-mib", help="Largest message, MiB (sizes go up by 4x from 4 KiB, "
                                         "to 4096 at most).")] = MAX_MIB,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed transfers per size (median).")] = 10,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a collective may wait for a peer.")] = 300.0,
) -> None:
    """Peer bandwidth and latency between the ranks' GPUs (ring send/recv, all-to-all, peer copy)."""
    import torch
    for flag, value, high in (("--max-mib", max_mib, MAX_MIB), ("--repeat", repeat, common.MAX_REPEAT)):
        if not 1 <= value <= high:
            raise UserError(f"bad {flag} {value}: expected an integer in 1..{high}")
    if not 0 < timeout <= common.MAX_WAIT_S:
        raise UserError(f"bad --timeout {timeout:g}: give the seconds a collective may wait, in (0, {common.MAX_WAIT_S:g}]")
    if common.env_int("WORLD_SIZE", 1, low=1) < 2:
        raise UserError("links measures transfers between ranks: run it under torchrun with 2 or more processes "
                        "(torchrun --nproc_per_node 2 -m attnbench links)")
    if output is not None:
        if output.suffix != ".json":
            raise UserError(f"--output {output}: give a .json file")
        check_output(output, "--output")
    from attnbench.distributed import bench
    from attnbench.distributed import links as lk
    ctx = bench.init_distributed(None, timeout)  # NCCL on GPUs; gloo on CPU (host memory, for tests)
    sizes = [s for s in lk.DEFAULT_SIZES if s <= max_mib * 2**20]
    rows = lk.measure(ctx.device, sizes, repeat=repeat)
    if ctx.rank == 0:
        limits = lk.ceiling_for(ctx.device)
        fitted = lk.fit(lk.mark_implausible(rows, limits), limits)
        _print(rows, fitted, ctx.world)
        if output is not None:
            from attnbench.results.env import device_name
            cuda = ctx.device.type == "cuda"
            doc = {"device": device_name(ctx.device), "world_size": ctx.world, "backend": ctx.backend,
                   "gpus_visible": torch.cuda.device_count() if cuda else 0,
                   "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                   "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None, "rows": rows, "fit": fitted}
            write_text_atomic(output, json.dumps(doc, indent=1))
            common.console.print(f"written to {output}", highlight=False)
    import torch.distributed as torch_dist
    torch_dist.barrier()
    torch_dist.destroy_process_group()


def _print(rows: list[dict], fitted: dict, world: int) -> None:
    from attnbench.distributed.links import KINDS
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    table = Table(title=f"transfers between {world} ranks: GB/s per direction per GPU (median ms)", header_style="bold")
    table.add_column("bytes", justify="right")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for size in sorted({r["bytes"] for r in rows}):
        cells = []
        for kind in kinds:
            r = next((r for r in rows if r["kind"] == kind and r["bytes"] == size), None)
            gbs = "-" if r is None else "implausible" if r.get("implausible") else f"{r['gbs']:.1f}"
            cells.append("-" if r is None else f"{gbs} ({r['median_ms']:.3f})")
        table.add_row(_human(size), *cells)
    common.console.print(table)
    for r in rows:
        if r.get("implausible"):
            common.console.print(f"{r['kind']} at {_human(r['bytes'])}: implausible: {r['implausible']}",
                                 highlight=False, markup=False)
    for kind, f in fitted.items():
        bandwidth = (f"{f['gbs']:.1f} GB/s (at {_human(f['to_bytes'])})" if f["gbs"] is not None else
                     f"not fitted: {f['unfitted']}")
        common.console.print(f"{kind}: latency {f['latency_us']:.1f} us (at {_human(f['from_bytes'])}), bandwidth "
                             f"{bandwidth}", highlight=False, markup=False)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}"
        n /= 1024
    return str(n)

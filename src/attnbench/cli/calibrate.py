"""`attnbench calibrate`: measure this device's matmul and copy peaks and store them for % of peak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.results import env as envmod
from attnbench.results.store import DEFAULT_DB, ResultStore
from attnbench.timing import peaks as peaksmod


def calibrate(
    device: common.Device = None,
    db: common.Db = None,
    size: Annotated[int | None, typer.Option(
        "--size", help="Matmul size n (n x n x n) (default: 8192 on GPU, 256 on CPU).")] = None,
    copy_mib: Annotated[int | None, typer.Option(
        "--copy-mib", help="Bytes copied, in MiB (default: 2048 on GPU, 64 on CPU).")] = None,
    repeat: Annotated[int | None, typer.Option(
        "--repeat", help="Timed calls per measurement (median) (default: 20 on GPU, 5 on CPU).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Measure dense bf16/fp16 matmul TFLOP/s and copy GB/s here; `run` then shows % of the measured peak."""
    dev = common.resolve_device(device)
    for value, name, high in ((size, "--size", 2**20), (copy_mib, "--copy-mib", 2**20),
                              (repeat, "--repeat", common.MAX_REPEAT)):
        if value is not None and not 1 <= value <= high:
            raise UserError(f"bad {name} {value}: expected an integer in 1..{high}")
    from attnbench import memory
    free = memory.available_bytes(dev)
    need = max(3 * (size or 0) ** 2 * 2, 2 * (copy_mib or 0) * 2**20)  # a, b, out in 16 bits; copy source + target
    if free is not None and need > free:
        asked = " ".join(f"{flag} {v}" for flag, v in (("--size", size), ("--copy-mib", copy_mib)) if v)
        raise UserError(f"{asked}: needs {memory.format_bytes(need)}, {memory.format_bytes(free)} available on {dev} "
                        "(not run): use a smaller --size / --copy-mib")
    path = Path(db or DEFAULT_DB)
    ResultStore.check_writable(common.check_db_path(path))  # before measuring, not after
    result = peaksmod.calibrate(dev, matmul_n=size, copy_bytes=copy_mib * 2**20 if copy_mib else None, repeat=repeat)
    env = envmod.collect(dev)
    env_id, name = envmod.env_id(env), envmod.device_name(dev)
    with ResultStore(path) as store:
        store.add_env(env_id, env)
        for kind, value in result["measured"].items():
            store.add_peak(name, env_id, kind, value, peaksmod.KINDS[kind], result["details"])
    sheet = peaksmod.datasheet(name)
    rows = [{"kind": kind, "unit": peaksmod.KINDS[kind], "measured": value, "datasheet": sheet.get(kind),
             "fraction_of_datasheet": value / sheet[kind] if sheet.get(kind) else None}
            for kind, value in result["measured"].items()]
    if as_json:
        common.console.print_json(json.dumps({"device": name, "env_id": env_id, "db": str(path), "peaks": rows,
                                              "details": result["details"]}))
        return
    table = Table(title=f"peaks of {name} ({dev})", header_style="bold")
    for col in ("peak", "measured", "datasheet", "measured / datasheet"):
        table.add_column(col, justify="left" if col == "peak" else "right")
    for r in rows:
        ratio = "-" if r["fraction_of_datasheet"] is None else f"{100 * r['fraction_of_datasheet']:.0f}%"
        table.add_row(f"{r['kind']} ({r['unit']})", f"{r['measured']:.4g}",
                      "-" if r["datasheet"] is None else f"{r['datasheet']:.0f}", ratio)
    common.console.print(table)
    common.console.print(f"stored in {path}; `attnbench run` on this device now shows % of the measured peak",
                         highlight=False)

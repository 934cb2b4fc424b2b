"""`attnbench backends` and `attnbench env`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.backends import registry
from attnbench.backends.base import device_type
from attnbench.cli import common
from attnbench.results import env as envmod


def _caps_summary(caps) -> str:
    flags = [name for name, on in (("gqa", caps.gqa), ("varlen", caps.varlen), ("causal", caps.causal),
                                   ("window", caps.window), ("sta-mask", caps.tile_mask), ("sinks", caps.sinks),
                                   ("softcap", caps.softcap), ("alibi", caps.alibi), ("bwd", caps.backward)) if on]
    dims = f"d<={caps.max_head_dim}" if caps.head_dims is None else "d in " + ",".join(map(str, caps.head_dims))
    exact = [] if caps.exact else ["approximate"]
    return " ".join(["/".join(caps.dtypes), dims, *flags, *exact])


def backends(
    device: common.Device = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every known backend: available here or not (with the reason), version and capabilities."""
    dev = common.resolve_device(device)
    rows = []
    for name in registry.names():
        try:
            backend = registry.get(name)
        except Exception as exc:  # a broken plug-in is shown, not fatal
            rows.append({"name": name, "available": False, "reason": f"failed to load: {exc}", "version": None,
                         "description": "", "capabilities": ""})
            continue
        reason = backend.unavailable_reason()
        if reason is None and device_type(dev) not in backend.capabilities.devices:
            reason = f"runs on {'/'.join(backend.capabilities.devices)}, not {device_type(dev)}"
        rows.append({"name": name, "available": reason is None, "reason": reason,
                     "version": backend.version() if reason is None else None,
                     "description": backend.describe(dev) if reason is None else backend.description,
                     "capabilities": _caps_summary(backend.capabilities)})
    if as_json:
        common.console.print_json(json.dumps(rows))
        return
    table = Table(title=f"attnbench backends on {dev}", header_style="bold")
    for col in ("backend", "available", "version", "capabilities", "description / reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        mark = "[green]yes[/]" if r["available"] else "[dim]no[/]"
        text = r["description"] if r["available"] else f"[dim]{escape(r['reason'] or '')}[/]"
        table.add_row(r["name"], mark, r["version"] or "-", r["capabilities"], text)
    common.console.print(table)


def presets() -> None:
    """List the model presets of run --preset: each model's attention heads, head size and variants."""
    from attnbench import presets as presets_mod
    for name in presets_mod.PRESETS:
        common.console.print(f"{name:<14} {presets_mod.describe(name)}", highlight=False, markup=False)


def env(
    device: common.Device = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print the environment fingerprint recorded with every run."""
    dev = common.resolve_device(device)
    data = envmod.collect(dev)
    data["env_id"] = envmod.env_id(data)
    if as_json:
        common.console.print_json(json.dumps(data, default=str))
        return
    table = Table(title="attnbench environment", header_style="bold", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        table.add_row(key, escape(str(value)))
    common.console.print(table)

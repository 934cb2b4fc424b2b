"""`attnbench backends` and `attnbench env`."""

from __future__ import annotations

import json
import re
import time
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from attnbench import features
from attnbench.backends import registry
from attnbench.cli import common
from attnbench.results import env as envmod


def _caps_summary(caps) -> str:
    flags = [name for name, on in (("gqa", caps.gqa), ("varlen", caps.varlen), ("causal", caps.causal),
                                   ("window", caps.window), ("sta-mask", caps.tile_mask),
                                   *((f.name, getattr(caps, f.name)) for f in features.FEATURES),
                                   ("paged", caps.paged), ("prefix", caps.shared_prefix), ("tree", caps.tree),
                                   ("kv-fp8", caps.kv_fp8), ("bwd", caps.backward)) if on]
    dims = f"d<={caps.max_head_dim}" if caps.head_dims is None else "d in " + ",".join(map(str, caps.head_dims))
    exact = [] if caps.exact else ["approximate"]
    return " ".join(["/".join(caps.dtypes), dims, *flags, *exact])


def backends(
    device: common.Device = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every known backend: available here or not (why, how to install it), version, capabilities."""
    dev = common.resolve_device(device)
    rows = [_backend_row(name, dev) for name in registry.names()]
    if as_json:
        common.console.print_json(json.dumps(rows))
        return
    here = [r for r in rows if r["available"]]
    table = Table(title=f"{len(here)} of {len(rows)} backends run on {dev} here", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("backend", "version", "capabilities", "what runs"):
        table.add_column(col, overflow="fold", no_wrap=col in ("backend", "version"))
    for r in here:
        table.add_row(r["name"], r["version"] or "-", r["capabilities"], escape(r["description"]))
    common.console.print(table)
    missing = [r for r in rows if not r["available"]]
    gpu_only = [r for r in missing if r["reason"].startswith(NO_GPU)]
    if gpu_only:  # before any install hint: none of them can help on this machine
        common.console.print(f"no GPU here: {len(gpu_only)} of the backends run on a GPU only; their installs "
                             "below are for a machine with one", highlight=False, markup=False)
    if missing:
        common.console.print(_missing_table(missing, dev))


def _backend_row(name: str, dev: str) -> dict:
    """What ``backends`` shows of one backend (also its --json row)."""
    from attnbench.backends.base import device_type

    try:
        backend = registry.get(name)
    except Exception as exc:  # a broken plug-in is shown, not fatal
        return {"name": name, "available": False, "reason": f"failed to load: {exc}", "install": None,
                "version": None, "description": "", "capabilities": ""}
    reason, install = backend.unavailable_reason(), None
    if reason is not None:
        install = backend.install_hint()
    if backend.needs_absent_gpu() and not backend.device_hint(dev):  # said first: installing cannot help here
        runs_on = f" (runs on {'/'.join(backend.capabilities.devices)})"
        reason = NO_GPU + runs_on + (f"; {_why(reason)}" if reason else "")
    elif device_type(dev) not in backend.capabilities.devices:
        hint = backend.device_hint(dev)  # flex on CPU: an option away
        reason = f"runs on {'/'.join(backend.capabilities.devices)}" + (f"; {hint}" if hint else f", not {device_type(dev)}")
    return {"name": name, "available": reason is None, "reason": reason, "install": install,
            "version": backend.version() if reason is None else None,
            "description": backend.describe(dev) if reason is None else backend.description,
            "capabilities": _caps_summary(backend.capabilities) if backend.operator == "attention"
            else f"--op {backend.operator}: {'/'.join(backend.capabilities.dtypes)}"
            + (" bwd" if backend.capabilities.backward else "")}


NO_GPU = "no GPU here"
"""The first words of why a GPU-only backend cannot run on a machine without one."""
MISSING_MODULE = re.compile(r"^(\S+) not importable: ModuleNotFoundError: No module named '([^']+)'")


def _why(reason: str) -> str:
    """A reason as ``backends`` groups it: a module that is simply absent reads 'not installed'."""
    found = MISSING_MODULE.match(reason or "")
    if found and found.group(2).split(".")[0] == found.group(1).split(".")[0]:
        return f"{found.group(1)} is not installed"
    return reason or ""


def _missing_table(rows: list[dict], dev: str) -> Table:
    """The backends that cannot run here, grouped by why and how to install what they need."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        groups.setdefault((_why(r["reason"]), r["install"] or ""), []).append(r["name"])
    table = Table(title=f"{len(rows)} cannot run on {dev} here: why, and how to install what they need",
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("backends", "why not", "install"):
        table.add_column(col, overflow="fold")
    for (why, install), names in groups.items():
        table.add_row(", ".join(names), escape(why), escape(install or "-"))
    return table


def presets() -> None:
    """List the model presets of run --preset: each model's attention heads, head size and variants."""
    from attnbench import presets as presets_mod
    width = max(map(len, presets_mod.PRESETS)) + 1
    for name in presets_mod.PRESETS:
        common.console.print(f"{name:<{width}} {presets_mod.describe(name)}", highlight=False, markup=False,
                             soft_wrap=True)  # one line a preset, whatever the width (the terminal folds it)


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
    table = Table(title="attnbench environment", title_justify="left", header_style="bold", show_header=False,
                  box=box.SIMPLE, pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if key == "platform":
            value = envmod.describe_platform(data)
        elif key == "collected_at" and isinstance(value, (int, float)):
            value = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
        elif isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        table.add_row(key, escape(str(value)))
    common.console.print(table)

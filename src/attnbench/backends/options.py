"""Backend options from the command line: ``--backend-opt NAME.KEY=VALUE`` (repeatable).

Each option becomes a constructor keyword of backend NAME; the configured backend is registered
under the same name for the rest of the process, so every command path (run, e2e) gets it through
``registry.get``. Values are read as YAML scalars: ``0.5`` is a float, ``true`` a bool, ``local`` a string.
"""

from __future__ import annotations

import functools

import yaml

from attnbench.backends import registry


def parse(items: list[str] | None) -> dict[str, dict]:
    """``["flex-sparse.sparsity=0.5", ...]`` -> ``{"flex-sparse": {"sparsity": 0.5}}``; ValueError if malformed."""
    out: dict[str, dict] = {}
    for item in items or []:
        target, eq, value = str(item).partition("=")
        name, dot, key = target.rpartition(".")
        if not eq or not dot or not name or not key.isidentifier():
            raise ValueError(f"bad --backend-opt {item!r}: write BACKEND.KEY=VALUE, e.g. flex-sparse.sparsity=0.5")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            parsed = value
        out.setdefault(name, {})[key] = parsed
    return out


def apply(items: list[str] | None) -> dict[str, dict]:
    """Parse ``items`` and register each configured backend; ValueError naming the bad option."""
    options = parse(items)
    for name, kwargs in options.items():
        if name not in registry.names():
            raise ValueError(f"--backend-opt {name}: unknown backend; known: {', '.join(registry.names())}")
        cls = type(registry.get(name))
        try:
            cls(**kwargs)  # validate now: a bad option is a usage error, not a failed case later
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--backend-opt {name}: {exc}") from None
        registry.register(name, functools.partial(cls, **kwargs))
    return options

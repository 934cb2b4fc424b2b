"""Name -> backend. Built-in adapters are listed here explicitly; third-party packages add theirs
through the ``attnbench.backends`` entry point group (the entry point names a Backend subclass or a
zero-argument factory returning a Backend instance)."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging

from attnbench.backends.base import Backend

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "attnbench.backends"

# name -> "module:Class"; modules are imported only when the backend is asked for.
BUILTIN: dict[str, str] = {
    "naive": "attnbench.backends.naive:NaiveBackend",
    "sdpa-math": "attnbench.backends.sdpa:SdpaMath",
    "sdpa-flash": "attnbench.backends.sdpa:SdpaFlash",
    "sdpa-efficient": "attnbench.backends.sdpa:SdpaEfficient",
    "sdpa-cudnn": "attnbench.backends.sdpa:SdpaCudnn",
    "flex-sparse": "attnbench.backends.flex_sparse:FlexSparse",
}

_extra: dict[str, object] = {}


def register(name: str, factory) -> None:
    """Register a backend class or factory under ``name`` (overrides a built-in of that name)."""
    _extra[name] = factory


def _entry_points() -> dict[str, object]:
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # Python 3.10 with an old importlib.metadata
        eps = importlib.metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    return {ep.name: ep for ep in eps}


def names() -> list[str]:
    """Every known backend name: built-ins, registered and entry points (in that order)."""
    return list(dict.fromkeys([*BUILTIN, *_extra, *_entry_points()]))


def get(name: str) -> Backend:
    """Instantiate backend ``name``; ValueError naming the known backends if it does not exist."""
    if name in _extra:
        target = _extra[name]
    elif name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        target = getattr(importlib.import_module(module), attr)
    elif name in (eps := _entry_points()):
        target = eps[name].load()
    else:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(names())}")
    backend = target()
    if not isinstance(backend, Backend):
        raise TypeError(f"backend {name!r} is a {type(backend).__name__}, not an attnbench Backend")
    if not backend.name:
        backend.name = name
    return backend


def available(device) -> list[str]:
    """Names of the backends that can run on ``device`` here (package importable, device type allowed)."""
    out = []
    for name in names():
        try:
            backend = get(name)
        except Exception as exc:  # a broken third-party plug-in must not break the listing
            log.warning("backend %s failed to load: %s", name, exc)
            continue
        from attnbench.backends.base import device_type
        if backend.unavailable_reason() is None and device_type(device) in backend.capabilities.devices:
            out.append(name)
    return out

"""Attention backends: one adapter per file behind the registry.

The names below are looked up when first used: ``attnbench.backends.registry`` lists and finds backends
without importing torch, which every adapter (and ``base``) needs.
"""

import importlib

_EXPORTS = {"Backend": "base", "BackendUnavailable": "base", "Capabilities": "base", "Outputs": "base",
            "Prepared": "base", "available": "registry", "get": "registry", "names": "registry",
            "register": "registry"}

__all__ = ["Backend", "BackendUnavailable", "Capabilities", "Outputs", "Prepared", "available", "get", "names",
           "register"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

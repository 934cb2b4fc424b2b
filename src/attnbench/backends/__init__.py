"""Attention backends: one adapter per file behind the registry."""

from attnbench.backends.base import Backend, BackendUnavailable, Capabilities, Outputs, Prepared
from attnbench.backends.registry import available, get, names, register

__all__ = ["Backend", "BackendUnavailable", "Capabilities", "Outputs", "Prepared", "available", "get", "names",
           "register"]

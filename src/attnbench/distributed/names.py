"""The local kernels of context parallelism by name (torch-free, for the scaling model's CSVs too)."""

from __future__ import annotations

KERNELS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "fa2", "fa3", "fa4")
"""The local kernels by the names every other command gives their backends (``attnbench backends``)."""
OLD_NAMES = {"flash": "sdpa-flash", "cpu-flash": "sdpa-flash", "efficient": "sdpa-efficient", "cudnn": "sdpa-cudnn",
             "math": "sdpa-math"}
"""Names dist took before it used the backends' names: still read (stored CSVs, older scripts), never shown."""


def canonical(name: str) -> str:
    """A kernel's name as every command gives it: ``sdpa-flash`` for the ``flash`` and ``cpu-flash`` of old."""
    return OLD_NAMES.get(name, name)

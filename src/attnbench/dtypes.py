"""Element types by name as torch dtypes, with torch imported only when a dtype itself is asked for.

The names are known without torch, so what only validates or prints them (a sweep, the results store, the
CLI's help) starts without importing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class TorchDtypes(Mapping):
    """Name -> ``torch.dtype``, from name -> attribute of the ``torch`` module (``{"bf16": "bfloat16"}``)."""

    def __init__(self, attributes: dict[str, str]):
        self._attributes = dict(attributes)

    def __getitem__(self, name: str):
        attribute = self._attributes[name]
        import torch

        return getattr(torch, attribute)

    def __contains__(self, name) -> bool:  # Mapping's would look the dtype up
        return name in self._attributes

    def __iter__(self) -> Iterator[str]:
        return iter(self._attributes)

    def __len__(self) -> int:
        return len(self._attributes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._attributes!r})"

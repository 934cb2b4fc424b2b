"""What a call returns and what the reference returns: one type, a set of named tensors.

The names are ``out`` and ``lse`` (the natural-log log-sum-exp, where a kernel returns it), and one gradient
per differentiable input, named ``d`` + the input's name: ``dq``, ``dk``, ``dv``, and those of the inputs a
feature of the case declares (``attnbench.features``). The checker, the tolerance, the records and the views
compare and show whatever names both sides have; nothing downstream lists them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def grad_name(input_name: str) -> str:
    """The name of the gradient of input ``input_name``: ``q`` -> ``dq``."""
    return "d" + input_name


class Outputs:
    """Named tensors of one call (or of the exact reference); a name never set reads as None.

    ``Outputs(out=o, lse=l, dq=g)``; ``outputs.out``; ``outputs["dq"]``; ``outputs.tensors()`` gives the ones
    that are set. Attributes set later (``ref.dq = ...``) join the set."""

    def __init__(self, **tensors: torch.Tensor | None):
        object.__setattr__(self, "_tensors", {})
        for name, value in tensors.items():
            setattr(self, name, value)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_tensors":  # copy and pickle probe before __init__ ran
            raise AttributeError(name)
        return self._tensors.get(name)

    def __setattr__(self, name: str, value) -> None:
        if value is None:
            self._tensors.pop(name, None)
        else:
            self._tensors[name] = value

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __setitem__(self, name: str, value: torch.Tensor | None) -> None:
        setattr(self, name, value)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors that are set, by name."""
        return dict(self._tensors)

    def replace(self, **changes) -> Outputs:
        """A copy with some tensors changed (None removes one)."""
        return Outputs(**{**self._tensors, **changes})

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self._tensors.items())
        return f"Outputs({shapes})"

"""Logit softcap (Gemma 2, Grok): the scaled scores s become ``c · tanh(s / c)``.

Applied to the scaled scores before ALiBi and the mask. Its derivative ``1 − tanh²(s / c)`` multiplies dS in
the backward. It adds no FLOPs to the convention (``metrics``): a tanh is elementwise work on the scores.
"""

from __future__ import annotations

import math

import torch

from attnbench.features.base import Feature, FeatureError, Option, finite_number, shown


def softcap(score: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(score / cap)``."""
    return cap * torch.tanh(score / cap)


class _Block:
    def __init__(self, cap: float):
        self.cap = cap

    def apply_(self, s, box):
        s.div_(self.cap).tanh_()
        derivative = 1 - s.square()
        s.mul_(self.cap)
        return derivative


class Softcap(Feature):
    name = "softcap"
    title = "a logit softcap"
    refusal = "logit softcap not supported"
    off = None
    options = (Option("softcap", ("--softcap",), "C",
                      "Logit softcap C·tanh(s/C) (Gemma 2: 50); several values and none are an axis.", multi=True),)

    def normalize(self, value):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    def check(self, value, spec) -> None:
        if not (isinstance(value, float) and math.isfinite(value) and value > 0):
            raise ValueError(f"softcap must be a finite number > 0, got {value!r}")

    def label(self, value) -> str:
        return f"softcap{value:g}"

    def axis(self, value) -> str:
        return f"softcap {value:g}" if value is not None else "no softcap"

    def settings(self, opts: dict):
        value = opts.get("softcap")
        if value is None:
            return None
        out = []
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and item.strip().lower() == "none":
                out.append(None)
                continue
            cap = finite_number(item)
            if not (math.isfinite(cap) and cap > 0):
                raise FeatureError(f"bad --softcap {shown(item)}: give a finite number > 0 (Gemma 2 uses 50), or none")
            out.append(cap)
        if not out:
            raise FeatureError("--softcap is empty; give a number like 50, or none")
        return tuple(dict.fromkeys(out))

    def score_mod(self, value, sq, sk, device):
        return lambda scores, rows=None: softcap(scores, value)

    def block_term(self, value, heads_q, heads_kv, dtype, device):
        return _Block(value)


FEATURE = Softcap()

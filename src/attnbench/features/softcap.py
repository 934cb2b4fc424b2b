"""Logit softcap (Gemma 2, Grok): the scaled scores s become ``c · tanh(s / c)``.

Applied to the scaled scores before ALiBi and the mask. Its derivative ``1 − tanh²(s / c)`` multiplies dS in
the backward. It adds no FLOPs to the convention (``metrics``): a tanh is elementwise work on the scores.

**Inputs that make it matter.** With N(0, 1) inputs the scaled scores have a standard deviation of 1, far below
any cap a model uses (Gemma 2: 50), where ``c · tanh(s / c)`` is the identity to a few parts in 10⁴ and its
derivative 1: a kernel without the softcap's derivative in its backward passed a bf16 check. A case with a
softcap therefore draws q and k scaled (``qk_scale``) so that its scaled scores have a standard deviation of
``c / 4`` before the cap: about 5% of them lie at ``|s| ≥ c / 2``, where tanh bends (derivative ≤ 0.79), the
largest reach the cap itself; the softmax stays finite and the rows keep several keys of weight, since the
cap compresses the top scores. A kernel that drops the derivative, or applies the cap to unscaled scores, fails
in bf16 (``tests/unit/test_variants.py``). The same case without a softcap keeps its N(0, 1) inputs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnbench.features.base import Feature, FeatureError, Option, finite_number, fits_as_divisor, shown

SCORE_SPREAD = 4.0
"""The scaled scores of a case with a softcap c are drawn with a standard deviation of c / SCORE_SPREAD (module doc)."""


def softcap(score: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(score / cap)``."""
    return cap * (score / cap).tanh()


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
        fits_as_divisor(value, spec.dtype, "softcap")  # the scores are divided by it

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

    def qk_scale(self, value, spec) -> float:
        # q·k of N(0, a²) elements times the softmax scale has a standard deviation a² · scale · √d
        return math.sqrt(value / SCORE_SPREAD / (spec.softmax_scale * math.sqrt(spec.head_dim)))

    def score_mod(self, value, sq, sk, device):
        return lambda scores, rows=None: softcap(scores, value)

    def block_term(self, value, heads_q, heads_kv, dtype, device):
        return _Block(value)


FEATURE = Softcap()

if TYPE_CHECKING:
    import torch

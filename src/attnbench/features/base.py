"""The declaration of a feature of the case: what every layer needs to know about it, in one place.

A feature is one field of ``AttnSpec`` (its ``name``) that changes the attention problem: a term in the
scores, in each row's softmax, or on the output. Its module declares (see the files beside this one):

- the field's value when off, how a value is checked and normalised, and its label in a case's name;
- the command-line flags and YAML key (the parameter names), their parser and one-line errors, and how a
  value is resolved for one case (the standard ALiBi slopes of its head count);
- the capability a backend declares for it (``Capabilities`` has a field of the same name) and the
  refusal a backend without it records;
- the seeded inputs it adds (``FeatureInput``: a name, a shape rule, whether it has a gradient) and how
  they are drawn so that the feature matters;
- the exact definition, in the forms the reference (in blocks, in place, with its derivative), the math
  baseline and the naive backend (plain differentiable PyTorch) use.

Every layer (labels, sweeps, the CLI, summary, grid and plot axes, exports, ``backends``, presets, inputs,
reference, baseline, checker, byte counts) loops over ``attnbench.features.FEATURES``; none names a feature.
A feature implements the hooks of its stage and leaves the others as they are here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the declarations load without torch (the CLI's help, presets, views)
    import torch

Setting = object
"""One value of a feature's sweep axis, before it is resolved for a case (ALiBi: True = the standard slopes)."""


class FeatureError(ValueError):
    """Bad input for a feature (a flag's value, a file): one line for the user."""


@dataclass(frozen=True)
class FeatureInput:
    """A seeded input tensor a feature adds to the case (besides q, k, v and dout)."""

    name: str
    """Its name: ``inputs.<name>``, the forward's keyword, and (with a gradient) ``d<name>`` among the outputs."""
    per_token: bool
    """Shaped like the output, (B, Sq, Hq, Dv) or packed (Tq, Hq, Dv), in the case's layout: sliced with the
    query rows. Otherwise one value per query head, (Hq,) float32, shared by every sequence (its gradient sums
    over them)."""
    grad: bool = True
    """Differentiable: backward passes return its gradient."""


@dataclass(frozen=True)
class Option:
    """A command-line option of a feature, declared once for run, verify, e2e and YAML."""

    param: str
    """Parameter name (the YAML key, dashes or underscores)."""
    flags: tuple[str, ...]
    """The flag, and for a tri-state flag its negation: ``("--x", "--no-x")``."""
    metavar: str
    help: str
    multi: bool = False
    """Takes several values after one flag (an axis: ``--x 30 50 none``)."""
    path: bool = False
    """Its value is a file."""

    @property
    def tristate(self) -> bool:
        return len(self.flags) == 2


class Feature:
    """Base class: a feature's declaration and the default (no-op) hooks of every stage."""

    name: str = ""
    """The ``AttnSpec`` field, ``Capabilities`` field, record/export column and summary axis."""
    title: str = ""
    """What it is, for messages: 'ALiBi'."""
    refusal: str = ""
    """What a backend without it records as its reason: 'ALiBi not supported'."""
    off: object = None
    """The field's value when the feature is off."""
    stage: str = "score"
    """Where it acts: ``score`` (a term on the scaled scores), ``rows`` (each row's softmax), ``output``."""
    options: tuple[Option, ...] = ()
    inputs: tuple[FeatureInput, ...] = ()
    json_column: bool = False
    """Its exported value is a list (written as JSON in a CSV)."""
    serving: bool = False
    """Combines with the features of a serving step (shared prefixes, trees, fp8 KV caches)."""

    # ---- the field -----------------------------------------------------------------------------
    def on(self, value) -> bool:
        return value is not None and value is not False

    def normalize(self, value):
        """The value as the spec stores it (lists from JSON become tuples)."""
        return value

    def check(self, value, spec) -> None:
        """ValueError when ``value`` is not a valid setting for ``spec`` (called only when on)."""

    def label(self, value) -> str:
        """Its word in a case's label (``b2 s4096 ... <label>``)."""
        return self.name

    def axis(self, value) -> str:
        """Its value on a summary, grid or plot axis: the label when on, 'no <name>' when off."""
        return self.label(value) if self.on(value) else f"no {self.name}"

    def export(self, value):
        """Its value in an export row."""
        return value

    def from_text(self, value):
        """An export row's value read back from a CSV cell (JSON columns are decoded before)."""
        if isinstance(value, str) and self.off is False:
            return value.lower() == "true"
        return value if isinstance(value, (bool, list, tuple)) else float(value)

    # ---- options -> settings -> values ----------------------------------------------------------
    def settings(self, opts: dict) -> tuple[Setting, ...] | None:
        """The axis values the merged options ask for (None if the feature's options are unset)."""
        return None

    def resolve(self, setting: Setting, heads_q: int):
        """The spec value of one setting for a case with ``heads_q`` query heads."""
        return setting

    def rebase(self, value, heads_q: int):
        """A case's value carried to a shape with ``heads_q`` heads (verify's default shapes)."""
        return value

    def model_value(self, opts: dict):
        """The one value a model's layers take (``e2e``): a model has a feature or not, no 'both'."""
        values = self.settings(opts)
        if values is None:
            return self.off
        if len(values) > 1:
            raise FeatureError(f"{self.options[0].flags[0]} both: a model has {self.name} or not; run it twice to "
                               "compare" if self.options[0].tristate else
                               f"{self.options[0].flags[0]} takes one value for a model, got {len(values)}")
        return values[0]

    # ---- inputs and bytes ------------------------------------------------------------------------
    def qk_scale(self, value, spec) -> float:
        """A factor on the drawn q and k so that the feature matters (its terms reach their non-linear range);
        1 leaves the case's inputs those of the same case without the feature."""
        return 1.0

    def draw(self, spec, gen: torch.Generator, device, like_out: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
        """Its seeded input tensors for ``spec`` (drawn after q, k, v and dout, so theirs do not change);
        ``like_out()`` draws N(0, 1) shaped and laid out like the output."""
        return {}

    def input_bytes(self, spec, tokens_q: int, lse_bytes: int) -> int:
        """Bytes of its inputs, read once (a backward writes their gradients: as many again)."""
        total = 0
        for item in self.inputs:
            total += tokens_q * spec.heads_q * spec.head_dim_v * spec.out_dtype.itemsize if item.per_token else \
                spec.heads_q * lse_bytes
        return total

    # ---- the definition, as plain differentiable PyTorch (naive backend, math baseline) ---------
    def score_mod(self, value, sq: int, sk: int, device) -> Callable | None:
        """``fn(scores, rows) -> scores`` on (..., Hq, rows, Sk) scaled scores of query rows ``rows`` (a slice),
        its buffers built once (as a model keeps them); None when the feature is not a score term."""
        return None

    def softmax(self, scores: torch.Tensor, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row stage: (probabilities, lse) of (..., Hq, rows, Sk) masked scores."""
        raise NotImplementedError

    def output(self, out: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """Output stage: the case's output from attention's output (same layout as ``tensor``)."""
        raise NotImplementedError

    # ---- the exact reference (blocks, in place, gradients by hand) -------------------------------
    def block_term(self, value, heads_q: int, heads_kv: int, dtype, device):
        """Score stage: an object whose ``apply_(s, box)`` changes a (B·Hkv, G·rows, keys) score block in
        place and returns the derivative that multiplies dS in the backward (None when it is 1)."""
        return None

    def rows_forward(self, out, lse, tensor, dtype):
        """Row stage: (out, lse) of the whole case after the feature joins every row's softmax; ``out`` is
        (B·Hkv, G, Sq, Dv), ``lse`` (B·Hkv, G, Sq)."""
        raise NotImplementedError

    def rows_grad(self, out, dout, lse, tensor, dtype, rows: int) -> torch.Tensor:
        """Row stage: the gradient of its input, from bshd ``out``, ``dout`` and the (B, Hq, Sq) ``lse``."""
        raise NotImplementedError

    def output_dout(self, dout, tensor, dtype) -> torch.Tensor:
        """Output stage: the dO attention sees, from the case's ``dout``, in ``dtype``."""
        raise NotImplementedError

    def output_grad(self, out_attn, dout, tensor, dtype) -> torch.Tensor:
        """Output stage: the gradient of its input, from attention's output and the case's ``dout``."""
        raise NotImplementedError


class Switch(Feature):
    """A feature that is on or off (its first option a tri-state flag: ``--x``, ``--no-x``, ``--x both``)."""

    off = False

    def check(self, value, spec) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{self.name} must be true or false, got {value!r}")

    def settings(self, opts: dict):
        option = self.options[0]
        return tristate(opts.get(option.param), option.flags[0])

    def export(self, value):
        return bool(value)


def finite_number(value) -> float:
    """``value`` as a float (a YAML number or a string like '50'); NaN for anything else (true, 'x', a list)."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


MAX_SHOWN = 80
"""Longest echo of one input value inside a message."""


def shown(value) -> str:
    """``repr(value)`` cut to MAX_SHOWN characters, for echoing user input in a message (the CLI's too)."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 12] + f"… ({len(text)} chars)"


LARGEST = {"fp16": 65504.0, "bf16": 3.3895313892515355e38, "fp32": 3.4028234663852886e38,
           "fp64": 1.7976931348623157e308, "fp8": 3.3895313892515355e38, "fp8-head": 3.3895313892515355e38}
"""The largest finite value of each case dtype's score arithmetic (fp8 inputs score in bf16 or wider): a term
larger than this is infinite in the kernel, which then returns NaN — bad input, not a wrong kernel."""


def fits(value: float, dtype: str, what: str) -> None:
    """ValueError when ``value`` is past what ``dtype`` holds (``LARGEST``)."""
    if abs(value) > LARGEST.get(dtype, math.inf):
        raise ValueError(f"{what} {value:g} does not fit {dtype} (largest finite {LARGEST[dtype]:.4g}): the kernel "
                         "would compute infinities; give a smaller value")


SMALLEST = {"fp16": 6.103515625e-05, "bf16": 1.1754943508222875e-38, "fp32": 1.1754943508222875e-38,
            "fp64": 2.2250738585072014e-308, "fp8": 1.1754943508222875e-38, "fp8-head": 1.1754943508222875e-38}
"""The smallest normal value of each case dtype's score arithmetic (as ``LARGEST``): a divisor below it is
subnormal or zero in the kernel, and dividing by it gives infinities, then NaN — bad input, not a wrong kernel."""


def fits_as_divisor(value: float, dtype: str, what: str) -> None:
    """ValueError when ``value``, which the kernel divides by, is past what ``dtype`` holds either way: larger
    than ``LARGEST`` or smaller than ``SMALLEST`` (``--softcap 1e-320`` is 0 in fp32)."""
    fits(value, dtype, what)
    if abs(value) < SMALLEST.get(dtype, 0.0):
        raise ValueError(f"{what} {value:g} underflows {dtype} (smallest normal {SMALLEST[dtype]:.4g}): the kernel "
                         "would divide by zero or a subnormal and compute infinities; give a larger value")


BOOLEAN_WORDS = {"both": (False, True), "true": (True,), "yes": (True,), "1": (True,), "on": (True,),
                 "false": (False,), "no": (False,), "0": (False,), "off": (False,)}
"""What a tri-state flag's value may be (``--causal``, ``--causal both``)."""


def tristate(value, flag: str) -> tuple[bool, ...] | None:
    """A tri-state flag's value: both, true or false; None if unset; FeatureError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        return (value,)
    text = str(value).lower()
    if text not in BOOLEAN_WORDS:
        raise FeatureError(f"bad {flag} value {shown(value)}; allowed: both, true, false")
    return BOOLEAN_WORDS[text]

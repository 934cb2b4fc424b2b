"""The features of the case, each declared once (``base.Feature``) in a small file of its own, and the loops
every layer runs over them. Adding one: its file, a line in ``FEATURES``, a field of ``AttnSpec`` and of
``backends.base.Capabilities``, and its support in the backends that take it.
"""

from __future__ import annotations

import itertools

from attnbench.features import alibi, gate, sinks, softcap
from attnbench.features.base import Feature, FeatureError, FeatureInput, Option

FEATURES: tuple[Feature, ...] = (sinks.FEATURE, softcap.FEATURE, alibi.FEATURE, gate.FEATURE)
"""In label order: a case reads ``... sinks softcap50 alibi gate``."""

BY_NAME = {f.name: f for f in FEATURES}
NAMES = tuple(BY_NAME)

__all__ = ["BY_NAME", "FEATURES", "NAMES", "Feature", "FeatureError", "FeatureInput", "Option", "active", "axes",
           "defaults", "draw_key", "grad_names", "inputs_of", "label_parts", "options", "qk_scale", "resolve",
           "settings", "settings_product", "value"]


def defaults() -> dict:
    """Every feature's field at its 'off' value."""
    return {f.name: f.off for f in FEATURES}


def active(spec) -> tuple[Feature, ...]:
    """The features ``spec`` (an AttnSpec, or a stored spec's dict) has on."""
    return tuple(f for f in FEATURES if f.on(value(spec, f)))


def value(spec, feature: Feature):
    """``feature``'s value in ``spec`` (an AttnSpec, or a stored spec's dict: its off value when absent)."""
    get = spec.get if isinstance(spec, dict) else (lambda name, off: getattr(spec, name, off))
    return feature.normalize(get(feature.name, feature.off))


def inputs_of(spec) -> tuple[FeatureInput, ...]:
    """The feature inputs of ``spec``, in declaration order."""
    return tuple(item for f in active(spec) for item in f.inputs)


def qk_scale(spec) -> float:
    """The product of the active features' factors on q and k (``Feature.qk_scale``)."""
    factor = 1.0
    for f in active(spec):
        factor *= f.qk_scale(value(spec, f), spec)
    return factor


def draw_key(spec) -> tuple:
    """What the features change in a case's drawn inputs: cases that share it (and their shape) share inputs."""
    return (tuple(item.name for item in inputs_of(spec)), qk_scale(spec))


def grad_names(spec) -> tuple[str, ...]:
    """The names of the feature inputs of ``spec`` that have a gradient (``sinks``, ``gate``)."""
    return tuple(item.name for item in inputs_of(spec) if item.grad)


def label_parts(spec) -> list[str]:
    """The label words of the features ``spec`` has on."""
    return [f.label(value(spec, f)) for f in active(spec)]


def axes(spec) -> dict[str, str]:
    """Each feature's axis text for ``spec`` ('sinks' / 'no sinks')."""
    return {f.name: f.axis(value(spec, f)) for f in FEATURES}


def options() -> tuple[Option, ...]:
    """Every feature's command-line options."""
    return tuple(o for f in FEATURES for o in f.options)


def settings(opts: dict) -> dict[str, tuple]:
    """Each feature's axis values from merged options (features whose options are unset are left out)."""
    out = {}
    for f in FEATURES:
        values = f.settings(opts)
        if values is not None:
            out[f.name] = values
    return out


def settings_product(axes_by_name: dict[str, tuple]) -> list[dict]:
    """Every combination of the features' axis values (an unset feature: off)."""
    names = list(NAMES)
    values = [axes_by_name.get(n, (BY_NAME[n].off,)) for n in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def resolve(setting: dict, heads_q: int) -> dict:
    """One combination of settings as AttnSpec fields for a case with ``heads_q`` query heads."""
    return {name: BY_NAME[name].resolve(s, heads_q) for name, s in setting.items()}

"""Backend options from the command line: ``--backend-opt NAME.KEY=VALUE`` (repeatable).

Each option becomes a constructor keyword of backend NAME: ``resolve`` checks them and returns them by backend,
and the command hands them to the backends it builds (``registry.get(name, options)``: the run's
``RunOptions.backend_options``, an e2e run's ``E2EConfig.backend_options``). Nothing global changes, so a script
that makes several plans in one process gets each plan's options, never another's.
Values are read as YAML scalars: ``0.5`` is a float, ``true`` a bool, ``local`` a string.

Every value is checked when the option is parsed, before anything runs, against what the backend's
constructor declares: its parameter annotations give the type (a ``bool`` takes ``true`` or ``false``
only, an ``int`` an integer, a ``float`` a finite number, a ``str`` any scalar, as text), and the class's
``option_ranges`` table the accepted range of a numeric option; an integer option with no declared range
takes 0..2**31-1 (a 32-bit kernel argument). A text option with a closed set of values names them in the
class's ``option_choices`` table (a tuple, or a function returning one where the values depend on what is
installed, such as torch.compile's backends): any other value is refused, naming the allowed ones. Options a
backend takes through ``**kwargs`` (SageAttention's kernel arguments, SpargeAttn's knobs) are checked where
its ``option_types`` / ``option_ranges`` / ``option_choices`` name them and otherwise left to the backend.
The constructor then validates what it knows on top (a pattern's name, a block that is a power of two).
"""

from __future__ import annotations

import inspect
import math
import types
import typing

from attnbench.backends import registry

DEFAULT_INT_RANGE = (0, 2**31 - 1)
"""Accepted range of an integer option whose backend declares none."""


def parse(items: list[str] | None) -> dict[str, dict]:
    """``["flex-sparse.sparsity=0.5", ...]`` -> ``{"flex-sparse": {"sparsity": 0.5}}``; ValueError if malformed."""
    import yaml

    out: dict[str, dict] = {}
    for item in items or []:
        target, eq, value = str(item).partition("=")
        name, dot, key = target.rpartition(".")
        if not eq or not dot or not name or not key.isidentifier():
            raise ValueError(f"bad --backend-opt {item!r}: write BACKEND.KEY=VALUE, e.g. flex-sparse.sparsity=0.5")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except (yaml.YAMLError, RecursionError):
            parsed = value
        if isinstance(parsed, (list, dict, set)) or not isinstance(parsed, (str, int, float, bool, type(None))):
            raise ValueError(f"bad --backend-opt {item[:80]!r}: give one value (a number, true/false or a word)")
        out.setdefault(name, {})[key] = parsed
    return out


def _kinds(annotation) -> tuple[set[type], bool]:
    """({bool, int, float, str} the annotation allows, whether None is allowed)."""
    if annotation is inspect.Parameter.empty:
        return set(), True
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    kinds = {a for a in args if a in (bool, int, float, str)}
    return kinds, type(None) in args


def _expected(kinds: set[type], bounds: tuple | None) -> str:
    if bool in kinds:
        return "true or false"
    if int in kinds and float not in kinds:
        return f"an integer in {bounds[0]}..{bounds[1]}"
    if float in kinds:
        return f"a number in [{bounds[0]:g}, {bounds[1]:g}]" if bounds else "a finite number"
    return "a word or a number"


def choices(cls, key: str) -> tuple[str, ...] | None:
    """The values option ``key`` of backend class ``cls`` may take (its ``option_choices``), None: any."""
    found = (getattr(cls, "option_choices", {}) or {}).get(key)
    return None if found is None else tuple(str(c) for c in (found() if callable(found) else found))


def check_value(cls, name: str, key: str, value, annotation) -> object:
    """``value`` as the constructor of ``cls`` takes it for option ``key``; ValueError naming what it accepts."""
    ranges = getattr(cls, "option_ranges", {}) or {}
    kinds, optional = _kinds(getattr(cls, "option_types", {}).get(key, annotation))
    if not kinds and key in ranges:
        kinds = {float}
    if value is None and optional:
        return value
    allowed = choices(cls, key)
    if allowed is not None and (isinstance(value, bool) or value is None or str(value) not in allowed):
        raise ValueError(f"bad --backend-opt {name}.{key}={value!r}: allowed: {', '.join(allowed)}")
    if not kinds:
        return value
    bounds = ranges.get(key, DEFAULT_INT_RANGE if int in kinds and float not in kinds else None)
    bad = ValueError(f"bad --backend-opt {name}.{key}={value!r}: expected {_expected(kinds, bounds)}")
    if bool in kinds:
        if not isinstance(value, bool):
            raise bad
        return value
    if int in kinds or float in kinds:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if isinstance(value, float) and (float not in kinds or not math.isfinite(value)):
            raise bad
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise bad
        return value
    if isinstance(value, bool) or value is None:
        raise bad
    return str(value)


def check(cls, name: str, kwargs: dict) -> dict:
    """``kwargs`` checked against the constructor of backend class ``cls`` (see the module doc)."""
    if cls.__init__ is object.__init__:
        params = {}
    else:
        try:
            params = inspect.signature(cls.__init__, eval_str=True).parameters
        except (TypeError, ValueError, NameError):  # a plug-in's constructor we cannot read: the class checks
            return dict(kwargs)
    named = {k: p for k, p in params.items() if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    out = {}
    for key, value in kwargs.items():
        if key not in named and not open_ended:
            raise ValueError(f"bad --backend-opt {name}.{key}: {name} has no option {key!r}; allowed: "
                             f"{', '.join(named) or 'none (it takes no options)'}")
        annotation = named[key].annotation if key in named else inspect.Parameter.empty
        out[key] = check_value(cls, name, key, value, annotation)
    return out


def resolve(items: list[str] | None) -> dict[str, dict]:
    """Parse and check ``items``: backend name -> the constructor options it takes (each backend built once with
    them, so a bad option is a usage error now, not a failed case later); ValueError naming the bad option. A run
    hands the result to its backends (``RunOptions.backend_options``); nothing global changes."""
    options = parse(items)
    for name, kwargs in options.items():
        if name not in registry.names():
            raise ValueError(f"--backend-opt {name}: unknown backend; known: {', '.join(registry.names())}")
        cls = type(registry.get(name))
        kwargs = check(cls, name, kwargs)
        try:
            cls(**kwargs)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"--backend-opt {name}: {exc}") from None
        options[name] = kwargs
    return options

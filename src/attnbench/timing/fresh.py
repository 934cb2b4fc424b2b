"""``--fresh-inputs``: every timed call gets inputs of its own values, and what the calls returned is checked.

A kernel can cache its output keyed on its input's address (or contents) and answer every timed call after
the first from the cache: timed on the same inputs call after call, it is fast and right. This mode takes
that away.

**The timed calls.** Before timing, ``FRESH_SETS`` input sets of the case's shapes are ready: the case's own
and sets drawn like it (same spec, same ``--input-scale``/``--outliers``) with the seeds ``seed + 1``,
``seed + 2``..., each with a closure the backend prepared over it. The timed calls take them in turn, so no
two calls in a row see the same values or addresses: a kernel remembering its last input computes every
call. In graph mode the input copies that the graph rotates over (``graph_closures``) are such sets rather
than clones of the case's inputs, as many as it rotates.

**The checks** (with ``--check``, the default), after the runner's own after-timing check:

- *the last timed call*: its outputs against the exact reference of the set it was handed (a kernel that
  answers with an earlier call's result, of other values, fails);
- *new values at a seen address*: the case's own values are written in place into the tensors of the last
  call's set (set 1 when the last call had the case's own), the backend prepares over them again and one
  call is checked against the case's reference (already computed, so this check costs no reference). A
  kernel that caches by address answers with what it computed for that set's values and fails. (The case's
  own tensors are never written to: the next backends of the shape use them.)

A failed check is a failed verdict: status ``mismatch``, the reason naming the check; both verdicts are in
``accuracy["fresh_inputs"]``. ``info["fresh_inputs"]`` says how many sets were rotated.

**What it does not catch**: a cache that holds every set's result (by contents, with ``FRESH_SETS`` entries
or more) answers right and fast; the plausibility ceilings are then the guard. A closure that keeps its own
first output (a fresh closure of its own per preparation) is caught by the ceilings too.

**Cost**: the extra sets' memory (``FRESH_SETS - 1`` copies of q, k, v, dout and the features' inputs) and
their preparation; on every timed call a Python call choosing the set (under a microsecond); after timing,
two more calls, one more preparation and, when the last timed call had another set than the case's own,
one more exact reference. On a CPU that reference dominates: see docs/guide.md for a sweep timed with and
without.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from attnbench import operators
from attnbench.inputs import InputDist
from attnbench.timing.graphs import tensors

FRESH_SETS = 4
"""Input sets the timed calls rotate over (the case's own among them) outside graph mode."""
FAILING = ("fail", "approx-fail")


class FreshInputs:
    """The input sets of one case and closures over them; remembers the last call's set and outputs."""

    def __init__(self, spec, backend, inputs, prepared, *, seed: int, dist: InputDist | None = None):
        self.spec, self.backend, self.seed, self.dist = spec, backend, seed, dist
        self.sets = [(inputs, prepared)]
        """(inputs, Prepared) per set; the first is the case's own."""
        self.last: tuple[int, object] | None = None
        """(set index, outputs) of the latest call made through ``closures`` or ``rotation``."""

    def extend(self, count: int) -> None:
        """Draw and prepare sets until there are ``count``."""
        device = self.sets[0][0].q.device
        while len(self.sets) < count:
            drawn = operators.of(self.spec).make_inputs(self.spec, device, self._seed(len(self.sets)), self.dist)
            self.sets.append((drawn, self.backend.prepare_case(self.spec, drawn)))

    def _seed(self, offset: int) -> int:
        return (self.seed + offset) % 2**63

    def closures(self) -> list[Callable[[], object]]:
        """One closure per set, each remembering its outputs as the last call's (graph mode rotates them)."""
        def closure(index: int, fn):
            def call():
                out = fn()
                self.last = (index, out)
                return out
            return call
        return [closure(i, prepared.fn) for i, (_, prepared) in enumerate(self.sets)]

    def rotation(self) -> Callable[[], object]:
        """A closure calling the sets' closures in turn, one set per call (``FRESH_SETS`` of them)."""
        self.extend(FRESH_SETS)
        fns = self.closures()
        state = [0]

        def call():
            i = state[0]
            state[0] = i + 1 if i + 1 < len(fns) else 0
            return fns[i]()
        return call

    def describe(self) -> dict:
        return {"sets": len(self.sets)}

    def check(self, checker, accuracy: dict) -> dict:
        """``accuracy`` with the verdicts of the last timed call and of new values at a seen address under
        ``"fresh_inputs"``; a failing one becomes the verdict (with its reason) when the case had passed."""
        result = dict(self.describe())
        if self.last is not None:
            index, out = self.last
            inputs, prepared = self.sets[index]
            if prepared.finish is not None:
                out = prepared.finish(out)
            last = checker(self.spec, inputs, out, self.backend)
            del out
            result["last_call"] = dict(_verdict(last), set=index)
            accuracy = _fail_with(accuracy, last, f"the last timed call (input set {index})")
        new = self._new_values(checker)
        result["new_values"] = _verdict(new)
        accuracy = _fail_with(accuracy, new, "new values in the inputs of an earlier call")
        return dict(accuracy, fresh_inputs=result)

    def _new_values(self, checker) -> dict:
        index = self.last[0] if self.last is not None and self.last[0] != 0 else 1
        self.extend(index + 1)
        own, target = self.sets[0][0], self.sets[index][0]
        overwrite(target, own)  # the case's values at an address a timed call saw with other values
        self.sets[index] = (dataclasses.replace(target, seed=own.seed), None)  # its old closure: not called again
        out = self.backend.prepare_case(self.spec, self.sets[index][0]).checked_call()
        if own.q.device.type == "cuda":
            torch.cuda.synchronize(own.q.device)
        return checker(self.spec, own, out, self.backend)  # the same values: the case's own reference, cached


def _verdict(accuracy: dict) -> dict:
    return {k: accuracy[k] for k in ("verdict", "reason") if k in accuracy}


def _fail_with(accuracy: dict, other: dict, what: str) -> dict:
    if other.get("verdict") not in FAILING or accuracy.get("verdict") in FAILING:
        return accuracy
    failed = dict(accuracy, verdict=other["verdict"], reason=f"fresh inputs, {what}: {other.get('reason')}")
    for key in ("tensors", "limits", "worst"):
        if key in other:
            failed[key] = other[key]
    return failed


def overwrite(dst, src) -> None:
    """Write ``src``'s values into ``dst``'s tensors in place (any operator's inputs: dataclasses, tensors, tuples,
    dicts of them). ValueError when a tensor's shape differs (index lists of another length)."""
    for a, b in zip(tensors(dst), tensors(src), strict=True):
        if a is b:
            continue
        if a.shape != b.shape:
            raise ValueError(f"cannot write values of shape {tuple(b.shape)} into a tensor of shape {tuple(a.shape)}")
        with torch.no_grad():
            a.copy_(b)

"""Per-step timelines of context-parallel calls: where each rank's time goes (``attnbench dist --timeline``).

The methods mark the end of each phase of a step on the compute stream (``mark``); with no recorder
active a mark does nothing. Inside ``recording()`` each mark records a CUDA event on the current
stream (a ``perf_counter`` time on CPU), and a phase lasts from the previous mark to its own. The
phases of a ring step, in order:

- ``gap``: the stream idles until the host has posted the step's transfers and reached its first
  launch (launch gaps; zero while the host is ahead of the GPU);
- ``kernel``: the local kernel of the step's block;
- ``merge``: the fp32 merge of the block's output (forward), the fp32 dQ/dK/dV accumulation (backward);
- ``wait``: the stream waits for the next K/V or for the arriving dK/dV accumulators: communication
  not hidden under compute, including the wait for a slower peer (load imbalance shows here);
- ``a2a``: Ulysses' all-to-alls, which nothing overlaps.

``summarize`` turns every rank's phases into per-step rows and per-rank totals, with each rank's
compute imbalance: the slowest rank's kernel time less its own.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch

PHASES = ("gap", "kernel", "merge", "wait", "a2a")
_active: Recorder | None = None


class Recorder:
    """The marks of one call on one rank."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, int, str, object]] = []
        self.where = ("fwd", 0)
        self.start = self._now()

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def mark(self, phase: str) -> None:
        self.marks.append((*self.where, phase, self._now()))

    def call_ms(self) -> float:
        """From the start to now: the whole call, when taken right after it (the device synchronized first)."""
        end = self._now()
        if self.cuda:
            torch.cuda.synchronize()
        return self._ms(self.start, end)

    def phases(self) -> list[tuple[str, int, str, float]]:
        """(pass, step, phase, ms) in the order marked; synchronizes the device first."""
        if self.cuda:
            torch.cuda.synchronize()
        out, last = [], self.start
        for pass_, step, phase, t in self.marks:
            out.append((pass_, step, phase, self._ms(last, t)))
            last = t
        return out


def begin_step(pass_: str, step: int) -> None:
    """Start step ``step`` of ``pass_`` (fwd or bwd): the time since the last mark is its ``gap``."""
    if _active is not None:
        _active.where = (pass_, step)
        _active.mark("gap")


def mark(phase: str) -> None:
    """End ``phase`` of the current step here."""
    if _active is not None:
        _active.mark(phase)


@contextmanager
def recording(device: torch.device):
    """Record the marks made inside; yields the Recorder (read ``phases()`` after the block)."""
    global _active
    if _active is not None:
        raise RuntimeError("a timeline is already being recorded")
    _active = Recorder(device)
    try:
        yield _active
    finally:
        _active = None


def record(fn, device: torch.device, calls: int) -> tuple[list[list], float]:
    """Call ``fn`` ``calls`` times under a recorder: [pass, step, phase, ms] summed per phase of a step, median
    over the calls; and the median time of those calls themselves (what the phases leave out is the difference)."""
    per_call, whole = [], []
    for _ in range(calls):
        with recording(device) as rec:
            fn()
            whole.append(rec.call_ms())
        totals: dict[tuple, float] = {}
        for pass_, step, phase, ms in rec.phases():
            totals[(pass_, step, phase)] = totals.get((pass_, step, phase), 0.0) + ms
        per_call.append(totals)
    keys = list(per_call[0])
    return [[*k, statistics.median(c.get(k, 0.0) for c in per_call)] for k in keys], statistics.median(whole)


def summarize(per_rank: list[list], call_ms: list[float] | None = None) -> tuple[list[dict], list[dict]]:
    """Per-step rows ({pass, step, phase: (min, max) over ranks}) and per-rank totals (ms), with each rank's
    recorded calls' own time (``call``) when ``call_ms`` is given."""
    steps: dict[tuple, dict] = {}
    for rows in per_rank:
        for pass_, step, phase, ms in rows:
            steps.setdefault((pass_, step), {}).setdefault(phase, []).append(ms)
    order = sorted(steps, key=lambda k: (k[0] != "fwd", k[1]))
    step_rows = [{"pass": p, "step": s, **{ph: (min(v), max(v)) for ph, v in steps[(p, s)].items()}}
                 for p, s in order]
    totals = []
    for rows in per_rank:
        t = {ph: 0.0 for ph in PHASES}
        for _, _, phase, ms in rows:
            t[phase] = t.get(phase, 0.0) + ms
        t["total"] = sum(t[ph] for ph in PHASES)
        totals.append(t)
    slowest = max((t["kernel"] for t in totals), default=0.0)
    for t in totals:
        t["imbalance"] = slowest - t["kernel"]
    for t, ms in zip(totals, call_ms or ()):
        t["call"] = ms
    return step_rows, totals

"""Compare two runs case by case: time ratio B/A with a bootstrap confidence interval.

Cases are matched by ``case_id`` (same spec, backend and timing mode). For each pair the ratio of
median times B/A is computed from the stored raw samples, and its confidence interval by resampling
both sample sets independently (percentile bootstrap, seeded from the case id so that a comparison
is reproducible). A ratio above 1 means B is slower. The resampled medians are those of the interval
each record stores (``timing.stats.bootstrap_medians``, 95%): ``compare`` and the summary's ``≈`` judge
from the same bootstrap of the same samples.

Verdicts: ``regression`` when the whole interval lies above 1 + threshold, ``slower`` when it lies
above 1 and within the threshold, ``faster`` when it lies below 1, ``same`` when it lies within
[1 / (1 + threshold), 1 + threshold], ``inconclusive`` when the data do not support any of these (fewer
than MIN_CONCLUSIVE samples on a side, where a bootstrap interval of the median is not to be trusted; an
interval that holds 1 but is wider than the threshold, where a large change could hide; an interval above 1
that reaches past the threshold, which cannot tell 1% slower from a regression), ``no-ci`` when either side
has fewer than two samples (no interval can be given).

A case timed on a busy CPU on either side (``record.busy_of``: other processes took its cores) is ``busy-cpu``:
not comparable. Other processes move a CPU timing both ways and by 5-20% from one run to the next (caches,
memory bandwidth, threads that lose their core), so neither a regression nor an improvement can be read from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from attnbench.results.record import busy_of
from attnbench.timing.stats import bootstrap_medians

MIN_SAMPLES = 2
MIN_CONCLUSIVE = 10
"""Fewest samples per side for a verdict: with fewer, a percentile bootstrap of the median is too ragged."""


@dataclass(frozen=True, kw_only=True)
class CaseComparison:
    """One case present in both runs."""

    case_id: str
    """Stable case id (results.record.case_id)."""
    backend: str
    label: str
    """Human label of the spec."""
    pass_: str
    status_a: str
    status_b: str
    a_ms: float | None = None
    """Median time in run A (ms)."""
    b_ms: float | None = None
    """Median time in run B (ms)."""
    ratio: float | None = None
    """b_ms / a_ms (> 1 = B slower)."""
    low: float | None = None
    """Lower end of the ratio's confidence interval."""
    high: float | None = None
    """Upper end of the ratio's confidence interval."""
    verdict: str = "no-ci"
    """regression | slower | same | faster | inconclusive | no-ci | busy-cpu (either side timed on a busy CPU:
    not comparable) | status (no timing to compare)."""
    why: str = ""
    """Why the verdict is ``inconclusive``."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Both runs, case by case."""

    cases: list[CaseComparison]
    """Cases present in both runs."""
    only_a: list[dict]
    """Rows of cases only run A has."""
    only_b: list[dict]
    """Rows of cases only run B has."""
    threshold: float
    """Regression threshold as a fraction (0.05 = 5 %)."""
    confidence: float
    """Confidence level of the intervals."""

    @property
    def regressions(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == "regression"]


def parse_threshold(text: str | float) -> float:
    """'5%' or '5' -> 0.05 (always percent); ValueError otherwise."""
    raw = str(text).strip().rstrip("%").strip()
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"bad threshold {text!r}: give a percentage like 5%") from None
    if not 0 <= value < 1000:
        raise ValueError(f"bad threshold {text!r}: must be between 0% and 1000%")
    return value / 100.0


def bootstrap_ratio(a_ms, b_ms, *, confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float | None, float | None]:
    """(median(b)/median(a), low, high); low/high None when a side has fewer than two samples."""
    a, b = np.asarray(a_ms, dtype=float), np.asarray(b_ms, dtype=float)
    ratio = float(np.median(b) / np.median(a))
    if a.size < MIN_SAMPLES or b.size < MIN_SAMPLES:
        return ratio, None, None
    # two streams: one seed for both would draw the same order statistics on each side, and two runs of
    # identical samples would get a ratio of exactly 1 with no width at all
    seed_a, seed_b = np.random.SeedSequence(seed).spawn(2)
    ratios = bootstrap_medians(b, resamples, seed_b) / bootstrap_medians(a, resamples, seed_a)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return ratio, float(low), float(high)


def verdict(low: float | None, high: float | None, threshold: float, samples: int = MIN_CONCLUSIVE) -> str:
    """The verdict of an interval (see the module doc); ``samples`` = the smaller side's sample count."""
    return judge(low, high, threshold, samples)[0]


def judge(low: float | None, high: float | None, threshold: float, samples: int) -> tuple[str, str]:
    """(verdict, why it is inconclusive or "")."""
    if low is None or high is None:
        return "no-ci", ""
    if samples < MIN_CONCLUSIVE:
        return "inconclusive", f"{samples} samples (a verdict needs {MIN_CONCLUSIVE} on each side)"
    if low > 1.0 + threshold:
        return "regression", ""
    if low > 1.0:
        if high <= 1.0 + threshold:
            return "slower", ""
        return "inconclusive", f"slower, but the interval reaches past +{threshold:.0%}"
    if high < 1.0:
        return "faster", ""
    if low >= 1.0 / (1.0 + threshold) and high <= 1.0 + threshold:
        return "same", ""
    return "inconclusive", f"the interval holds 1 but is wider than ±{threshold:.0%}"


def _samples(row: dict) -> list[float]:
    raw = row.get("samples_ms")
    values = json.loads(raw) if isinstance(raw, str) else (raw or [])
    if not values and row.get("median_ms") is not None:
        values = [row["median_ms"]]
    return values


def compare_case(a: dict, b: dict, threshold: float, confidence: float) -> CaseComparison:
    base = dict(case_id=a["case_id"], backend=a["backend"], label=a["label"], pass_=a["pass"],
                status_a=a["status"], status_b=b["status"], a_ms=a.get("median_ms"), b_ms=b.get("median_ms"))
    sa, sb = _samples(a), _samples(b)
    if a["status"] != "ok" or b["status"] != "ok" or not sa or not sb:
        return CaseComparison(**base, verdict="status")
    ratio, low, high = bootstrap_ratio(sa, sb, confidence=confidence, seed=int(a["case_id"][:8], 16))
    word, why = judge(low, high, threshold, min(len(sa), len(sb)))
    word, why = on_busy_cpu(word, why, busy_of(a.get("info")), busy_of(b.get("info")))
    return CaseComparison(**base, ratio=ratio, low=low, high=high, verdict=word, why=why)


BUSY = "busy-cpu"
"""The verdict of a case either side of which was timed on a busy CPU."""


def on_busy_cpu(word: str, why: str, busy_a: bool, busy_b: bool) -> tuple[str, str]:
    """The verdict once a side timed on a busy CPU is taken into account (see the module doc)."""
    if not (busy_a or busy_b) or word in ("no-ci", "status"):
        return word, why
    sides = " and ".join(name for name, busy in (("A", busy_a), ("B", busy_b)) if busy)
    return BUSY, f"timed on a busy CPU ({sides})"


def compare(rows_a: list[dict], rows_b: list[dict], *, threshold: float = 0.05,
            confidence: float = 0.95) -> Comparison:
    """Match the rows of two runs by case id (the last record of a case wins) and compare each pair."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    by_a = {r["case_id"]: r for r in rows_a}
    by_b = {r["case_id"]: r for r in rows_b}
    cases = [compare_case(by_a[c], by_b[c], threshold, confidence) for c in by_a if c in by_b]
    return Comparison(cases=cases, only_a=[r for c, r in by_a.items() if c not in by_b],
                      only_b=[r for c, r in by_b.items() if c not in by_a], threshold=threshold,
                      confidence=confidence)

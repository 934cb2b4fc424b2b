"""The counted footnotes under a summary, the verify grid and the report: what did not run, grouped by
reason; failed checks no cell shows; the CPU threads a CPU run was timed with."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from attnbench.results.record import FAILED_VERDICTS, Record, verdict_of
from attnbench.serving import describe, group_label
from attnbench.spec import LABEL_SEQUENCES


def unshown_failures(records: list[Record], shown: list) -> list[str]:
    """A line counting timed results that failed their check where no cell shows them (a shared column shows
    its best record, a failing approximate kernel gives way to a passing one), per backend. Results whose
    status says it (mismatch, nan) are counted with the statuses."""
    visible = {id(c.record) for c in shown if c.record is not None}
    hidden = Counter(r.backend for r in records if r.status == "ok"
                     and verdict_of(r.status, r.accuracy) in FAILED_VERDICTS and id(r) not in visible)
    if not hidden:
        return []
    per = ", ".join(f"{b} {n}" for b, n in hidden.most_common())
    return [f"{sum(hidden.values())} results failed their accuracy check in cells this table does not show "
            f"({per}): attnbench show --table lists every record"]


def grouped_note(records: list[Record]) -> list[str]:
    """A line when most backends skipped the grouped (varlen) cases: ``--seq-lens 128,256`` is one batch of two
    sequences, easily typed for two cases (``--seq-lens 128 256``), so say which was run."""
    if all(r.n <= 1 for r in records if r.status == "ok"):  # verify's cases, chosen for it: nothing was mistyped
        return []
    grouped = [r for r in records if getattr(r.spec, "operator", "attention") == "attention" and r.spec.is_varlen]
    backends = {r.backend for r in grouped}
    # a backend that ran any of them does not skip them, though it may skip one (a pass, a mask)
    skipped = backends - {r.backend for r in grouped if r.status != "unsupported"}
    if not grouped or 2 * len(skipped) <= len(backends):
        return []
    groups = list(dict.fromkeys(r.spec.seqlens_q for r in grouped))
    lens, more = groups[0], f" (and {len(groups) - 1} more grouped cases)" if len(groups) > 1 else ""
    skip = f"which {len(skipped)} of {len(backends)} backends skip"
    if len(lens) > LABEL_SEQUENCES:  # too long to spell out, or to mean one case per length
        return [f"{describe(lens, lens)} ran as one grouped (varlen) case of {len(lens)} sequences{more}, {skip}"]
    first, label = ",".join(map(str, lens)), group_label(lens)
    row = f" (row {label})" if label != first else ""  # the summary's name for it
    return [f"--seq-lens {first}{row} ran as one grouped (varlen) case, a batch of {len(lens)} sequences{more}, "
            f"{skip}; one case per length: --seq-lens {first.replace(',', ' ')}"]


def cpu_notes(records: list[Record]) -> list[str]:
    """CPU runs: the threads they were timed with, of how many cores, and what else was running."""
    cpus = [(i, r.info["cpu"]) for i, r in enumerate(records) if isinstance(r.info.get("cpu"), dict)]
    if not cpus:
        return []
    first = cpus[0][1]
    threads = [c.get("threads") for _, c in cpus]
    cores = first.get("cores")
    text = f"CPU: {threads[0]} thread{'s' * (threads[0] != 1)} of {cores or '?'} cores"
    others = first.get("others_at_start")
    if others and others >= 0.1:  # CPU time over a moment: it can read above the cores there are
        using = f"all {cores}" if isinstance(cores, int) and round(others, 1) >= cores else f"{others:.1f}"
        text += f" (other processes were using {using} cores when the run started)"
    lowered = next((i for (i, _), t in zip(cpus, threads) if t != threads[0]), None)
    if lowered is not None:
        text += f"; {min(threads)} from case {lowered + 1} on, when other processes took cores"
    return [text]


def reason_groups(records: list[Record]) -> list[tuple[str, str, int, list[str]]]:
    """(status, short reason, cases, backends) of ``records``, the most frequent first: what the summary,
    the verify grid and the report count instead of repeating a reason per case."""
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.status, short_reason(r.status, r.reason))].append(r)
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    return [(status, reason, len(recs), list(dict.fromkeys(r.backend for r in recs))) for (status, reason), recs in ordered]


def listed(names: list[str], most: int = 3) -> str:
    """'a, b, c +2'."""
    return ", ".join(names[:most]) + (f" +{len(names) - most}" if len(names) > most else "")


LIMIT_FAILURE = re.compile(r"\b(out|lse|dq|dk|dv) (\w+) \S+ ([<>]) \S+")
"""A failed measure in an accuracy verdict's reason: ``dv max_abs 0.00391 > 0.00301 (= 3 x math ...)``."""


def short_reason(status: str, reason: str | None) -> str:
    """A reason on one line, at most 60 characters. Reasons that differ from case to case only in their
    numbers become one: out-of-memory messages (sizes), failed accuracy checks (the errors and limits:
    ``dv max_abs above its limit``, so one backend's six failures are one line)."""
    if status == "oom":
        return "out of device memory"
    text = " ".join((reason or "").split())
    failed = LIMIT_FAILURE.findall(text)
    if status == "mismatch" and failed:
        prefix = text.split(":", 1)[0] + ": " if text.startswith("a call after") else ""
        parts = dict.fromkeys(f"{t} {m} {'above' if op == '>' else 'below'}" for t, m, op in failed)
        text = prefix + ", ".join(parts) + (" its limit" if len(parts) == 1 else " their limits")
    return text if len(text) <= 60 else text[:59] + "…"

"""How `attnbench run` ends when numbers are wrong: the cases, named in a last line that fits the width, and
exit status 1 (so scripts and CI notice); and when no case ran at all: the reasons counted, exit status 2."""

from __future__ import annotations

import collections

import typer

from attnbench.cli import common


def wrong_cases(records: list, approx_too: bool = False) -> list:
    """Cases whose numbers are wrong: status mismatch (an exact backend failed the check), nan (non-finite
    output, any backend) or implausible (a time the device cannot achieve), and with ``approx_too`` an
    approximate backend's ``approx-fail`` verdict."""
    return [r for r in records if r.status in ("mismatch", "nan", "implausible")
            or (approx_too and (r.accuracy or {}).get("verdict") == "approx-fail")]


def report_wrong_cases(records: list, approx_too: bool) -> None:
    """Last line on stderr and exit status 1 when any case is wrong (so scripts and CI notice); the line names
    as many of them as fit the width (``attnbench show --table`` has every record)."""
    wrong = wrong_cases(records, approx_too)
    if not wrong:
        return
    names = [f"{(r.accuracy or {}).get('verdict') if r.status == 'ok' else r.status} {r.backend} {r.spec.pass_} "
             f"{r.spec.label()}" for r in wrong]
    common.err_console.print(wrong_line(names, len(records), common.summary_width()), markup=False,
                             highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def wrong_line(names: list[str], total: int, width: int) -> str:
    """'attnbench: N of M cases wrong (first; second; +K more); exit status 1' within ``width`` characters
    (the last name shown cut when even one does not fit)."""
    head, tail = f"attnbench: {len(names)} of {total} cases wrong (", "); exit status 1"
    room = width - len(head) - len(tail)
    shown: list[str] = []
    for name in names:
        more = len(names) - len(shown) - 1
        if shown and len("; ".join([*shown, name]) + (f"; +{more} more" if more else "")) > room:
            break
        shown.append(name)
    more = f"; +{len(names) - len(shown)} more" if len(names) > len(shown) else ""
    text = "; ".join(shown)
    if len(text) + len(more) > room:
        text = text[:max(room - len(more) - 1, 10)] + "…"
    return head + text + more + tail


TIMED = ("ok", "mismatch", "nan", "implausible")
"""Statuses of a case that ran and was timed (its numbers may still be wrong)."""


def report_nothing_ran(records: list) -> None:
    """Exit status 2 with one line on stderr when records were made and none of them ran (every case
    unsupported, out of memory or failed here): the options asked for nothing that runs on this machine, which
    must not end like a run that answered. The reasons counted, the most frequent first."""
    if not records or any(r.status in TIMED for r in records):
        return
    reasons = collections.Counter(f"{r.status}: {r.reason or '?'}" for r in records)
    counted = "; ".join(f"{n} {why}" for why, n in reasons.most_common(3))
    more = f"; +{len(reasons) - 3} more reasons" if len(reasons) > 3 else ""
    takers = takers_elsewhere(list(dict.fromkeys(r.spec for r in records if r.status == "unsupported")),
                              {r.backend for r in records})
    them = "it" if len({r.spec for r in records}) == 1 else "them"
    where = f"; {takers} would take {them}" if takers else ""
    common.err_console.print(f"attnbench: none of the {len(records)} cases ran here ({counted}{more}){where}; "
                             "attnbench show --table lists them; exit status 2", markup=False, highlight=False,
                             soft_wrap=True)
    raise typer.Exit(2)


def takers_elsewhere(specs: list, tried: set[str]) -> str | None:
    """'flashinfer-paged (cuda), fa3 (cuda)': the backends besides ``tried`` whose capabilities take one of
    ``specs`` on a device of theirs, installed here or not (at most four named); None when there are none."""
    from attnbench.backends import registry
    from attnbench.backends.base import check_capabilities, check_operator_capabilities
    found = []
    for name in registry.names():
        if name in tried:
            continue
        try:
            backend = registry.get(name)
        except Exception:  # a broken plug-in takes nothing
            continue
        caps = backend.capabilities
        for spec in specs:
            if getattr(spec, "operator", "attention") != backend.operator:
                continue
            check = check_capabilities if backend.operator == "attention" else check_operator_capabilities
            device = next((d for d in caps.devices if check(caps, spec, d) is None), None)
            if device is not None:
                found.append(f"{name} ({device})")
                break
    if not found:
        return None
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")

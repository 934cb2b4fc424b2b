"""How `attnbench run` ends when numbers are wrong: the cases, named in a last line that fits the width, and
exit status 1 (so scripts and CI notice)."""

from __future__ import annotations

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

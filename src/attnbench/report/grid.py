"""`verify`'s answer on one screen: backends down, cases across, each cell the worst ratio of an error to its
limit (pass below 1), a mark where the check failed; the cases named in a short legend. Cases that do not fit
the width across go to further tables below."""

from __future__ import annotations

from attnbench import features
from attnbench.accuracy.tolerance import Tolerance, worst_ratio
from attnbench.report.footnotes import listed, reason_groups
from attnbench.report.summary import axes
from attnbench.results.record import FAILED_VERDICTS, Record, verdict_of

FAIL, FORWARD = "✗", "ᶠ"
STATUS_CELL = {"unsupported": "-", "oom": "oom", "error": "err", "nan": "nan", "implausible": "imp"}


def worst(record: Record) -> float | None:
    """The largest error / limit of a checked record (``tolerance.worst_ratio``); for approximate checks
    without the cosine, whose ratio to its minimum does not grow with the error (rel-L1 does)."""
    acc = record.accuracy or {}
    limits = {name: {m: v for m, v in lim.items() if m != "cosine"} for name, lim in (acc.get("limits") or {}).items()}
    found = worst_ratio(acc.get("tensors") or {}, limits)
    return None if found is None else found["ratio"]


NAME_ORDER = ("op", "batch", "seq", "keys", "topk", "heads", "head_dim", "dtype", "window", *features.NAMES,
              "layout", "mask")
"""The order of the axes in a case's name; an operator's other axes (``Operator.axes``) follow in its order."""


def case_key(record: Record) -> str:
    """The case of a record whatever its pass (a label leaves the pass out: a forward-only backend's record sits
    in the same column)."""
    return record.spec.label()


def axis_keys(positions) -> list[str]:
    """The axes of the cases in naming order: ``NAME_ORDER``, then an operator's own, the pass left out."""
    return list(dict.fromkeys([*NAME_ORDER, *(k for a in positions for k in a if k not in NAME_ORDER and k != "pass")]))


def case_names(records: list[Record]) -> dict[str, str]:
    """A short name per case (the values of the axes that differ between cases), keyed by ``case_key``. The
    words every case's operator shares (``gdn`` of ``gdn`` and ``gdn decode``) are the title's, not the names'."""
    specs = {case_key(r): axes(r) for r in records}
    varying = [k for k in axis_keys(specs.values()) if len({a.get(k, "") for a in specs.values()}) > 1]
    shared = common_op(specs.values())

    def name(a: dict) -> str:  # an axis at its default ("no mask", "no window", ...) goes unnamed
        values = [(k, " ".join(w for w in a.get(k, "").split() if k != "op" or w not in shared)) for k in varying]
        return " ".join(("s" if k == "seq" else "") + v for k, v in values if v and not v.startswith("no "))
    return {label: name(a) or label for label, a in specs.items()}


def common_op(positions) -> list[str]:
    """The words of the ``op`` axis every case shares (none for attention, which has no such axis)."""
    ops = [p.get("op", "").split() for p in positions]
    return [w for w in ops[0] if all(w in o for o in ops)] if ops else []


def operator_lead(positions: list[dict]) -> str:
    """Another operator's title lead: the words its cases share on the ``op`` axis, then the value of each other
    axis every case has, unless it is the default ("no sink"): ``gdn h16/64 d128 bf16 c16``. Empty for
    attention (no ``op`` axis), whose title names the features every case has instead."""
    op = common_op(positions)
    if not op:
        return ""
    fixed = [v for k in axis_keys(positions) if k != "op" and len(values := {p.get(k, "") for p in positions}) == 1
             and (v := next(iter(values))) and not v.startswith("no ")]
    return " ".join([*op, *fixed])


def build(records: list[Record]) -> tuple[list[str], list[str], dict, list[str]]:
    """(backends, case labels, {(backend, case): cell text}, legend lines)."""
    names = case_names(records)
    cases = list(names)
    backends = list(dict.fromkeys(r.backend for r in records))
    cells: dict[tuple[str, str], str] = {}
    backward = any(r.spec.pass_ != "fwd" for r in records)  # else forward is all there was to check: no mark
    for r in records:
        key = (r.backend, case_key(r))
        verdict = verdict_of(r.status, r.accuracy)
        if r.accuracy is None or r.status in ("unsupported", "oom", "error"):
            cells[key] = STATUS_CELL.get(r.status, "-")
            continue
        ratio = worst(r)
        text = ratio_text(ratio) if ratio is not None else "ok" if verdict == "pass" else "-"
        if r.spec.pass_ == "fwd" and backward:
            text += FORWARD
        if verdict in FAILED_VERDICTS or r.status in ("mismatch", "nan", "implausible"):
            text += FAIL
        cells[key] = text
    legend = [f"{i + 1:>2} {names[c]}" for i, c in enumerate(cases)]
    return backends, cases, cells, legend


def ratio_text(ratio: float) -> str:
    """A ratio in at most three characters: .27 below 1, 1.4 below 10, 12 and 340 above, 2e3 from 1000."""
    if ratio < 0.995:
        return f"{ratio:.2f}"[1:]
    if ratio < 9.95:
        return f"{ratio:.1f}"
    return f"{ratio:.0f}" if ratio < 999.5 else f"{ratio:.0e}".replace("e+0", "e").replace("e+", "e")


def panels(backends: list[str], cases: list[str], cells: dict, width: int) -> list[list[int]]:
    """The case indices of each table, as many cases as fit ``width`` across, spread evenly over the tables."""
    first = max([len("backend")] + [len(b) for b in backends])
    # a case's column: its cells, one space of padding before them and the rule between columns
    widths = [max(len(str(i + 1)), *(len(cells.get((b, c), "")) for b in backends)) + 2 for i, c in enumerate(cases)]
    fit, used = 0, first
    for w in widths:
        if used + w > width:
            break
        used, fit = used + w, fit + 1
    tables = -(-len(cases) // max(1, fit))
    size = -(-len(cases) // tables) if cases else 0
    return [list(range(i, min(i + size, len(cases)))) for i in range(0, len(cases), size)] if cases else [[]]


def legend_lines(items: list[str], width: int, lead: str = "cases: ") -> list[str]:
    """Items joined by "; " into lines of at most ``width`` characters, broken between items only (an item
    longer than a line has one to itself)."""
    lines, line = [], lead
    for i, item in enumerate(items):
        piece = item + (";" if i < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = " " * len(lead)
        line += piece + " "
    lines.append(line.rstrip())
    return lines


def render(records: list[Record], console, tolerance: Tolerance | None = None) -> None:
    """Print the grid (several tables when the cases do not fit the console's width across), the case legend,
    the marks it shows and counted reasons for what was not checked. ``tolerance``: the one the records were
    judged with (the checker's default), for the legend's k."""
    from rich import box
    from rich.table import Table
    tol = tolerance or Tolerance()
    width = console.width
    backends, cases, cells, legend = build(records)
    positions = [axes(r) for r in records]
    lead = operator_lead(positions)
    title = (f"{lead}: " if lead else "") + "worst error / limit per backend and case (a pass is below 1)"
    every = [v for k in features.NAMES if len(v := {p.get(k, "") for p in positions}) == 1
             and next(iter(v)) and not next(iter(v)).startswith("no ")]
    if every:  # features every case has (one that only some cases have is named in their legend)
        title += "; every case with " + ", ".join(next(iter(v)) for v in every)
    console.print(title, highlight=False, markup=False)
    shown = []
    for part in panels(backends, cases, cells, width):
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1), pad_edge=False)
        table.add_column("backend", no_wrap=True)
        for i in part:
            table.add_column(str(i + 1), justify="right", no_wrap=True)
        for b in backends:
            row = [cells.get((b, cases[i]), "") for i in part]
            if not any(t and t not in STATUS_CELL.values() for t in row):
                row = [t or "-" for t in row]
            shown += row
            table.add_row(b, *[f"[red]{t}[/]" if t.endswith(FAIL) else t for t in row])
        console.print(table)
    for line in legend_lines([x.strip() for x in legend], width):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    exact = {r.backend for r in records if r.info.get("exact", True)}
    approx = [b for b in backends if b not in exact]
    marks = [f"{mark} {text}" for mark, text in ((FAIL, "failed its check"),
                                                  (FORWARD, "forward only (no backward to check)"))
             if any(mark in t for t in shown)]  # the marks the tables show, not every mark there is
    checked = [r for r in records if r.accuracy is not None]
    own: dict[str, list[str]] = {}  # an operator's check of its own (the indexer's selection): its rule, stated
    for r in checked:
        if r.accuracy.get("rule"):
            own.setdefault(r.accuracy["rule"], []).append(r.backend)
    rule = [f"exact kernels: the worst error / its limit, a limit {tol.k:g} x the error of PyTorch math in the same "
            f"dtype ({tol.k_max:g} x for the largest element) + a floor"] \
        if not own or any(not r.accuracy.get("rule") for r in checked) else []
    notes = ["; ".join([*marks, *rule])] if marks or rule else []
    notes += [f"{', '.join(dict.fromkeys(names))}: {text}; a cell is the worst measure / its limit, ok where the "
              "check measures none" for text, names in own.items()]
    if approx:
        notes.append(f"approximate kernels ({', '.join(approx)}): rel-L1 vs its limit; their cosine is checked too")
    for status, reason, n, names in reason_groups([r for r in records if r.accuracy is None]):
        notes.append(f"not checked, {n} {status}: {reason} ({listed(names)})")
    for note in notes:
        console.print(note, highlight=False, markup=False)

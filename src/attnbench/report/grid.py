"""`verify`'s answer on one screen: backends down, cases across, each cell the worst ratio of an error to its
limit (pass below 1), a mark where the check failed; the cases named in a short legend."""

from __future__ import annotations

from attnbench import features
from attnbench.accuracy.tolerance import worst_ratio
from attnbench.report.footnotes import listed, reason_groups
from attnbench.report.summary import axes
from attnbench.results.record import FAILED_VERDICTS, Record, verdict_of

FAIL = "✗"
STATUS_CELL = {"unsupported": "-", "oom": "oom", "error": "err", "nan": "nan", "implausible": "imp"}


def worst(record: Record) -> float | None:
    """The largest error / limit of a checked record (``tolerance.worst_ratio``); for approximate checks
    without the cosine, whose ratio to its minimum does not grow with the error (rel-L1 does)."""
    acc = record.accuracy or {}
    limits = {name: {m: v for m, v in lim.items() if m != "cosine"} for name, lim in (acc.get("limits") or {}).items()}
    found = worst_ratio(acc.get("tensors") or {}, limits)
    return None if found is None else found["ratio"]


def case_names(records: list[Record]) -> dict[str, str]:
    """A short name per case (the values of the axes that differ between cases), keyed by the case label."""
    specs = {r.spec.replace(pass_="fwd_bwd").label(): axes(r) for r in records}
    varying = [k for k in ("batch", "seq", "keys", "heads", "head_dim", "dtype", "window", *features.NAMES,
                           "layout", "mask") if len({a.get(k, "") for a in specs.values()}) > 1]
    def name(a: dict) -> str:  # an axis at its default ("no mask", "no window", ...) goes unnamed
        parts = [("s" if k == "seq" else "") + a.get(k, "") for k in varying
                 if a.get(k, "") and not a.get(k, "").startswith("no ")]
        return " ".join(parts)
    return {label: name(a) or label for label, a in specs.items()}


def build(records: list[Record]) -> tuple[list[str], list[str], dict, list[str]]:
    """(backends, case labels, {(backend, case): cell text}, legend lines)."""
    names = case_names(records)
    cases = list(names)
    backends = list(dict.fromkeys(r.backend for r in records))
    cells: dict[tuple[str, str], str] = {}
    for r in records:
        key = (r.backend, r.spec.replace(pass_="fwd_bwd").label())
        verdict = verdict_of(r.status, r.accuracy)
        if r.accuracy is None or r.status in ("unsupported", "oom", "error"):
            cells[key] = STATUS_CELL.get(r.status, "-")
            continue
        ratio = worst(r)
        text = "-" if ratio is None else (f"{ratio:.2f}" if ratio < 10 else f"{ratio:.0f}")
        if r.spec.pass_ == "fwd":
            text += "ᶠ"
        if verdict in FAILED_VERDICTS or r.status in ("mismatch", "nan", "implausible"):
            text += FAIL
        cells[key] = text
    legend = [f"{i + 1:>2} {names[c]}" for i, c in enumerate(cases)]
    return backends, cases, cells, legend


def render(records: list[Record], console) -> None:
    """Print the grid, the case legend and counted reasons for what was not checked."""
    from rich import box
    from rich.table import Table
    backends, cases, cells, legend = build(records)
    title = "worst error / limit per backend and case (a pass is below 1)"
    positions = [axes(r) for r in records]
    every = [v for k in features.NAMES if len(v := {p[k] for p in positions}) == 1
             and not next(iter(v)).startswith("no ")]
    if every:  # features every case has (one that only some cases have is named in their legend)
        title += "; every case with " + ", ".join(next(iter(v)) for v in every)
    console.print(title, highlight=False, markup=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False)
    table.add_column("backend", no_wrap=True)
    for i in range(len(cases)):
        table.add_column(str(i + 1), justify="right", no_wrap=True)
    for b in backends:
        row = [cells.get((b, c), "") for c in cases]
        if not any(t and t not in STATUS_CELL.values() for t in row):
            row = [t or "-" for t in row]
        table.add_row(b, *[f"[red]{t}[/]" if t.endswith(FAIL) else t for t in row])
    console.print(table)
    console.print("cases: " + "; ".join(x.strip() for x in legend), highlight=False, markup=False)
    exact = {r.backend for r in records if r.info.get("exact", True)}
    approx = [b for b in backends if b not in exact]
    notes = [f"{FAIL} failed its check; ᶠ forward only (no backward to check); exact kernels: max error vs "
             "limit (k x the error of PyTorch math in the same dtype + a floor)"]
    if approx:
        notes.append(f"approximate kernels ({', '.join(approx)}): rel-L1 vs its limit; their cosine is checked too")
    for status, reason, n, names in reason_groups([r for r in records if r.accuracy is None]):
        notes.append(f"not checked, {n} {status}: {reason} ({listed(names)})")
    for note in notes:
        console.print(note, highlight=False, markup=False)

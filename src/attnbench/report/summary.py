"""The answer to a run, on one screen: which kernel is fastest at each shape, by how much, and is it right.

Records are grouped by the axes that stay fixed along a line (pass, causal, dtype, heads, ...); in each
group a pivot has the swept axis (the one with the most values: sequence length in the default sweeps)
as rows and backends as columns, the chosen metric in the cells. The fastest *exact* kernel of each row
is marked (``*``), or, when another exact kernel's 95% interval of the median overlaps its own, it and
those kernels are marked ``≈``: the run cannot rank them. Approximate kernels (quantized, sparse) report
dense-equivalent rates and are kept apart, never marked fastest. What did not run becomes counted footnotes, one line per reason.

The layout adapts to the width: when the backends do not fit, API forms of one kernel (``fa2``,
``fa2-varlen``, ``fa2-qkvpacked``, ...) share a column showing the best of them, then the approximate
kernels share one column naming the fastest, then the exact columns are split over several tables.
This module only computes and lays out; ``render`` draws it with rich.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from attnbench import features, metrics, operators
from attnbench.report.footnotes import cpu_notes, grouped_note, listed, reason_groups, unshown_failures
from attnbench.results.record import (
    FAILED_VERDICTS,
    Record,
    busy_of,
    clock_of,
    exact_of,
    interval_of,
    verdict_of,
)
from attnbench.serving import group_label, short_description, tree_label
from attnbench.spec import LABEL_SEQUENCES

METRICS = {"tflops": "TF/s", "ms": "ms", "gbps": "GB/s", "speedup": "x"}
API_FORMS = ("-varlen-qkvpacked", "-qkvpacked", "-kvpacked", "-varlen")
"""Name suffixes of another entry point to the same kernel: such columns may share their kernel's column."""
CELL = 6  # characters of a cell (value and marks)
HEADER_MAX = 10  # a column widens up to this for its title's parts ("flashinfer", "kvcache")
BEST, TIE, DROP, FAILED, BUSY = "*", "≈", "↓", "!", "?"
STATUS_CELL = {"unsupported": "-", "oom": "oom", "error": "err", "nan": "nan", "mismatch": "bad",
               "implausible": "imp"}


def axes(r: Record) -> dict[str, str]:
    """The case's position on every axis, as short labels (another operator's case: its own, ``axes``)."""
    s = r.spec
    if (op := operators.of(s)).name != "attention":
        return op.axes(s)
    seq = str(s.seqlens_q[0]) if not s.is_varlen else group_label(s.seqlens_q)
    many = len(s.seqlens_q) > LABEL_SEQUENCES  # a serving batch: its requests in the grammar, keys included
    if many:
        seq = short_description(s.seqlens_q, s.seqlens_k)
    if (r.info or {}).get("batch_name"):  # a trace's step: its name first, as the trace calls it
        seq = f"{r.info['batch_name']}: {seq}"
    out = {"pass": s.pass_, "mask": "causal" if s.causal else "no mask", "dtype": s.dtype, "batch": f"b{s.batch}",
           "seq": seq, "heads": f"h{s.heads_q}" + (f"/{s.heads_kv}" if s.gqa else ""),
           "head_dim": f"d{s.head_dim}" + (f"/{s.head_dim_v}" if s.head_dim_v != s.head_dim else "")}
    if s.seqlens_k != s.seqlens_q and not many:
        out["keys"] = "keys " + (str(s.seqlens_k[0]) if not s.is_varlen else ",".join(map(str, s.seqlens_k)))
    out["window"] = f"window {s.window[0]},{s.window[1]}" if s.has_window else "no window"
    out.update(features.axes(s))
    out["prefix"] = f"prefix {s.shared_prefix}" if s.shared_prefix else "no prefix"
    out["tree"] = tree_label(s.tree) if s.tree is not None else "no tree"
    out["kv"] = f"kv {s.kv_dtype}" if s.kv_dtype is not None else "kv " + s.dtype + " "  # a space: unshown fixed
    out["page"] = f"page {s.page_size}" if s.page_size is not None else "no pages"
    out["mla"] = "mla" if s.mla else "no mla"
    if s.sta is not None:
        out["mask"] = s.sta.label()
    if s.layout != "bshd":
        out["layout"] = s.layout
    return out


SWEEP_ORDER = ("seq", "keys", "topk", "batch", "head_dim", "heads", "dtype", "window", *features.NAMES, "page",
               "prefix", "tree", "kv", "mla", "layout", "mask", "op", "pass")
"""Which varying axis becomes the rows: the one with most values, ties broken in this order."""
LABEL_ORDER = ("op", "batch", "seq", "keys", "topk", "heads", "head_dim", "dtype", "mask", "window", *features.NAMES,
               "prefix", "tree", "kv", "page", "mla", "layout", "pass")
"""The order of the fixed axes in the header (that of a case label)."""
UNSHOWN_WHEN_FIXED = {"no window", *(f.axis(f.off) for f in features.FEATURES), "no prefix", "no tree", "no pages",
                      "no mla"}
"""Values of an axis every case shares that the header leaves out (they are the default)."""
ROW_TITLES = {"seq": "S", "keys": "keys", "batch": "B", "head_dim": "D", "heads": "heads", "dtype": "dtype",
              "topk": "top-k", "op": "op"}


def is_exact(r: Record) -> bool:
    """Held to exactness (not a quantized or sparse kernel's dense-equivalent rate)."""
    return exact_of(r.status, r.accuracy, r.info)


def _sort_key(value: str, tokens: int | None = None):
    """Rows by size, growing down the table: the query tokens of their cases where known (a row of sequences
    labelled "16q128" holds 2048, more than "128,128"), else the sum of the label's numbers; a trace's steps
    ("step 605: 178q1kv...") first by their names, in the trace's order where the names count up."""
    name, rest = value.split(": ", 1) if ": " in value else ("", value)
    return (_size_key(name) if name else (-1, ""), (tokens, rest) if tokens is not None else _size_key(rest))


def _size_key(value: str):
    nums = [int(x) for x in re.findall(r"\d+", value)]
    return (sum(nums), value) if nums else (math.inf, value)


@dataclass
class Cell:
    text: str
    value: float | None = None
    best: bool = False
    busy: bool = False
    """Timed while other processes kept the CPU busy (``BUSY``): its time is an upper bound."""
    tie: bool = False
    """The fastest exact kernel, or one whose interval overlaps the fastest's (``TIE``): not told apart."""
    record: Record | None = field(default=None, repr=False, compare=False)
    """The record shown (the best of a shared column's), for counting what the marks stand for."""


@dataclass
class Group:
    """The rows of one combination of the grouping axes (``title``: their values)."""

    title: tuple[str, ...]
    rows: list[str]
    cells: dict[tuple[str, str], Cell]
    """(row, column) -> cell."""


@dataclass
class Pivot:
    """One table: the swept axis as rows, grouped; one column per backend (or per shared column)."""

    row_axis: str
    columns: list[str]
    groups: list[Group]
    approx_column: str | None = None
    """Title of the column that names the fastest approximate kernel, when they share one."""


@dataclass
class Summary:
    """Everything the summary shows: a header line, the pivots and the footnotes."""

    header: str
    pivots: list[Pivot]
    shape: str = ""
    """The axes every case shares (e.g. ``b2 h16 d128 bf16``), for titles."""
    notes: list[str] = field(default_factory=list)
    """Footnotes, one line each."""
    legend: list[str] = field(default_factory=list)
    """What each mark in the cells means, one item a mark: a terminal shows them on one line (``LEGEND_GAP``
    apart), a page as items of their own (HTML would fold the gap into one space and run them together)."""
    approx: list[str] = field(default_factory=list)
    """The approximate backends (their columns, when they have their own)."""
    unit: str = "TF/s"
    """The cells' unit (GF/s for a CPU run's rates, x vs NAME for speedups)."""


def _value(r: Record, metric: str, base: Record | None, scale: float = 1.0) -> float | None:
    if r.status != "ok":
        return None
    if metric == "speedup":
        if base is None or base.status != "ok" or not base.median_ms or not r.median_ms:
            return None
        return base.median_ms / r.median_ms
    value = {"tflops": r.tflops, "ms": r.median_ms, "gbps": r.gbps}[metric]
    return None if value is None else value * scale


def unit_of(records: list[Record], metric: str) -> tuple[str, float]:
    """The cells' unit and its factor from the stored one: for rates, ``metrics.rate_unit`` of the records that
    ran (GF/s for a CPU run's); the metric's own unit otherwise."""
    if metric == "tflops":
        unit = metrics.rate_unit(r.tflops for r in records if r.status == "ok")
        return unit.short, unit.factor
    return METRICS[metric], 1.0


def fmt(value: float | None, metric: str) -> str:
    """A value in at most 4 characters (3 significant digits, fewer where it would not fit)."""
    if value is None or not math.isfinite(value):
        return "-"
    if metric == "speedup":
        if value < 0.01:  # a kernel 200x slower than the baseline is not "0.00" times as fast
            return f"{value:.0e}".replace("e-0", "e-")
        return f"{value:.3f}" if value < 0.1 else f"{value:.2f}" if value < 10 else f"{value:.0f}"
    if metric == "ms" and value < 1:
        return f"{value:.3f}" if value >= 0.001 else f"{value:.0e}".replace("e-0", "e-")
    if value >= 9999.5:
        return f"{value / 1000:.0f}k"
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 0.01 else f"{value:.0e}".replace("e-0", "e-")


def api_kernel(name: str, present: set[str]) -> str:
    """The column a backend shares when API forms are merged: ``fa2-varlen`` -> ``fa2`` if fa2 ran too."""
    for suffix in API_FORMS:
        if name.endswith(suffix) and name[: -len(suffix)] in present:
            return name[: -len(suffix)]
    return name


def build(records: list[Record], *, metric: str = "tflops", baseline: str | None = None,
          width: int = 100, device: str = "", planned: int | None = None) -> Summary:
    """The summary of ``records`` laid out for ``width`` columns; ``planned``: the cases the run set out to run
    (its stored count: more than the records when it was stopped), None: as many as the records."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    higher = metric != "ms"
    pos = {id(r): axes(r) for r in records}
    names = {k for p in pos.values() for k in p}
    values = {k: {p.get(k, "") for p in pos.values()} for k in names}
    varying = [k for k in SWEEP_ORDER if len(values.get(k, ())) > 1]
    row_axis = max(varying, key=lambda k: (len(values[k]), -SWEEP_ORDER.index(k))) if varying else "seq"
    group_axes = [k for k in SWEEP_ORDER if k in varying and k != row_axis]
    fixed = [_in_header(k, next(iter(values[k]))) for k in LABEL_ORDER if k in values and k not in varying
             and k != row_axis and next(iter(values[k])) and next(iter(values[k])) not in UNSHOWN_WHEN_FIXED
             and not next(iter(values[k])).endswith(" ")]
    by_case = {(_group_key(pos[id(r)], group_axes), pos[id(r)].get(row_axis, ""), r.backend): r for r in records}
    base_of = {}
    if metric == "speedup":
        baseline = baseline or "naive"
        base_of = {(g, row): r for (g, row, b), r in by_case.items() if b == baseline}
    backends = list(dict.fromkeys(r.backend for r in records))
    exact = [b for b in backends if any(is_exact(r) for r in records if r.backend == b and r.status == "ok")
             or not any(r.status == "ok" for r in records if r.backend == b)]
    approx = [b for b in backends if b not in exact]
    merged, columns, approx_column = _layout(exact, approx, width, len(ROW_TITLES.get(row_axis, row_axis)))
    unit, scale = unit_of(records, metric)
    groups = list(dict.fromkeys(g for g, _, _ in by_case))  # in the order the run measured them
    tokens = {row: operators.of(r.spec).columns(r.spec)["total_q"] for (_, row, _), r in by_case.items()
              } if row_axis == "seq" else {}
    built = []
    for g in groups:
        rows = sorted({row for gg, row, _ in by_case if gg == g}, key=lambda row: _sort_key(row, tokens.get(row)))
        cells = {}
        for row in rows:
            members: dict[str, list[Record]] = defaultdict(list)
            for (gg, rr, b), r in by_case.items():
                if gg == g and rr == row:
                    members[merged.get(b, b)].append(r)
            cells.update(_row_cells(row, members, {merged[b] for b in approx}, columns, approx_column,
                                    Scale(metric, higher, scale), base_of.get((g, row))))
        built.append(Group(title=tuple(v for _, v in g), rows=rows, cells=cells))
    pivots = [Pivot(row_axis=row_axis, columns=panel, groups=built,
                    approx_column=approx_column if i == len(columns) - 1 else None)
              for i, panel in enumerate(columns)]
    unit += f" vs {baseline}" if metric == "speedup" else ""
    ok = sum(r.status == "ok" for r in records)
    header = (f"{' '.join(fixed)}{' · ' if fixed else ''}{device + ' · ' if device else ''}{unit}"
              f"{' (median)' if metric == 'ms' else ''} · {ok} of {max(planned or 0, len(records))} cases ran")
    legend, notes = _notes(records, pivots, merged, approx, approx_column, metric)
    return Summary(header=header, pivots=pivots, shape=" ".join(fixed), notes=notes, legend=legend, approx=approx,
                   unit=unit)


def _in_header(axis: str, value: str) -> str:
    """A fixed axis's value as the header names it: a length as a label writes it (s128, s77,300), where a row
    of the S column is the bare number."""
    return f"s{value}" if axis == "seq" and re.fullmatch(r"[\d,]+", value) else value


@dataclass(frozen=True)
class Scale:
    """How cells are valued: the metric, whether higher is better, the unit's factor from the stored one."""

    metric: str
    higher: bool
    factor: float = 1.0


def _group_key(pos: dict, group_axes: list[str]) -> tuple:
    return tuple((a, pos.get(a, "")) for a in group_axes)


def _layout(exact: list[str], approx: list[str], width: int, label: int):
    """(backend -> column, list of column panels, approx column title or None) fitting ``width``."""
    budget = width - max(label, 5) - 2
    merged = {b: b for b in exact + approx}
    cols = exact + approx
    if _width(cols) > budget:  # API forms of one kernel share a column
        present = set(exact + approx)
        merged = {b: api_kernel(b, present) for b in exact + approx}
        cols = list(dict.fromkeys(merged.values()))
    approx_column = None
    approx_cols = [c for c in cols if c in {merged[b] for b in approx}]
    if approx_cols and _width(cols) > budget:  # approximate kernels share one column naming the fastest
        approx_column = "fastest approx."
        cols = [c for c in cols if c not in approx_cols]
        budget -= 20
    panels: list[list[str]] = [[]]
    for col in cols:
        if panels[-1] and _width(panels[-1] + [col]) > budget:
            panels.append([])
        panels[-1].append(col)
    return merged, panels, approx_column


def column_width(name: str) -> int:
    """Characters of a column: a cell, or its title's longest hyphen-separated part up to HEADER_MAX."""
    return max(CELL, min(HEADER_MAX, max(len(p) for p in name.split("-", 1))))


def _width(cols: list[str]) -> int:
    return sum(column_width(c) + 1 for c in cols)


def _row_cells(row: str, members: dict[str, list[Record]], approx_cols: set[str], panels: list[list[str]],
               approx_column: str | None, scale: Scale, base: Record | None) -> dict:
    """The cells of one row: a column's records -> its cell, the fastest exact kernels marked."""
    cells: dict[tuple[str, str], Cell] = {}
    shown = {c for panel in panels for c in panel}
    candidates = []
    for col, recs in members.items():
        pick = _pick(recs, scale, base)
        cells[(row, col)] = pick
        ran_exact = [r for r in recs if r.status == "ok" and is_exact(r)
                     and verdict_of(r.status, r.accuracy) not in ("fail", "nan")]
        if col in shown and pick.value is not None and ran_exact and col not in approx_cols:
            candidates.append((col, pick))
    ran = sum(any(r.median_ms is not None for r in recs) for recs in members.values())  # timed, right or wrong
    # a kernel alone in its row (the others did not run it) is the fastest of nothing: no mark
    top = fastest(candidates, scale.metric, scale.higher) if ran > 1 else []
    tied = unresolved(top, candidates, scale.higher)
    for col in top:
        cells[(row, col)].best = True
    for col in dict.fromkeys(top + tied):
        cells[(row, col)].tie = bool(tied)
        cells[(row, col)].text += TIE if tied else BEST
    if approx_column:
        cand = [(c, cells[(row, c)]) for c in approx_cols if (row, c) in cells and cells[(row, c)].value is not None]
        if cand:  # a kernel that passed its (looser) check before a faster one that failed it
            sign = 1 if scale.higher else -1
            col, cell = max(cand, key=lambda t: (FAILED not in t[1].text, sign * t[1].value))
            cells[(row, approx_column)] = Cell(f"{col} {cell.text}", cell.value, busy=cell.busy, record=cell.record)
        else:
            cells[(row, approx_column)] = Cell("-")
    return cells


def fastest(candidates: list[tuple[str, Cell]], metric: str, higher: bool) -> list[str]:
    """The columns marked fastest: every candidate that shows the best value (kernels tied at the precision
    shown are all marked), or none when another candidate was timed on a busy CPU: its real time is shorter
    than shown, so it may be the fastest."""
    if not candidates:
        return []
    best = fmt((max if higher else min)(c.value for _, c in candidates), metric)
    top = [col for col, c in candidates if fmt(c.value, metric) == best]
    return [] if any(c.busy for col, c in candidates if col not in top) else top


def unresolved(top: list[str], candidates: list[tuple[str, Cell]], higher: bool) -> list[str]:
    """The candidates this run cannot rank against the fastest (``top``, from ``fastest``): those whose 95%
    interval of the median (``record.interval_of``) overlaps the fastest's, the fastest ones included; [] when
    none does or the fastest has no interval. Overlap, not one median inside the other's interval: two kernels
    1% apart each known to +-0.6% are not ranked."""
    if not top:
        return []
    cells = dict(candidates)
    sign = 1 if higher else -1
    lead = max(top, key=lambda col: sign * cells[col].value)
    ref = interval_of(cells[lead].record.info) if cells[lead].record is not None else None
    if ref is None:
        return []
    near = [col for col, cell in candidates if col != lead and cell.record is not None
            and (ci := interval_of(cell.record.info)) is not None and ci[0] <= ref[1] and ref[0] <= ci[1]]
    return [lead, *near] if near else []


def _pick(recs: list[Record], scale: Scale, base: Record | None) -> Cell:
    """The cell of a column: the best of its records (several when API forms share a column)."""
    ok = [(v, r) for r in recs if (v := _value(r, scale.metric, base, scale.factor)) is not None]
    if not ok:
        statuses = sorted({r.status for r in recs})
        return Cell(STATUS_CELL.get(statuses[0], "-") if len(statuses) == 1 else "-")
    value, rec = (max if scale.higher else min)(ok, key=lambda t: t[0])
    text = fmt(value, scale.metric)
    if verdict_of(rec.status, rec.accuracy) in FAILED_VERDICTS:
        text += FAILED
    if clock_of(rec.info)[1]:
        text += DROP
    busy = busy_of(rec.info)
    if busy:
        text += BUSY
    return Cell(text, value, busy=busy, record=rec)


LEGEND_GAP = "   "
"""Between two items of the legend on a terminal's line."""


def _notes(records, pivots, merged, approx, approx_column, metric) -> tuple[list[str], list[str]]:
    """(the legend of the marks shown, the footnotes)."""
    shown = [g.cells[(row, c)] for pivot in pivots for g in pivot.groups for row in g.rows
             for c in [*pivot.columns, *([pivot.approx_column] if pivot.approx_column else [])] if (row, c) in g.cells]
    legend = [f"{BEST} fastest exact kernel"] if any(c.best and not c.tie for c in shown) else []
    if ties := sum(1 for c in shown if c.best and c.tie):
        legend.append(f"{TIE} fastest, within each other's interval ({ties} row{'s' * (ties != 1)})")
    for mark, meaning in ((DROP, "SM clock fell >10% in the case"), (FAILED, "failed its accuracy check"),
                          (BUSY, "CPU busy with other processes: not an idle machine's speed")):
        if n := sum(mark in c.text for c in shown):  # what the table shows, not what the run holds
            legend.append(f"{mark} {meaning} ({n})")
    notes = []
    if ties:
        notes.append(f"{TIE} the fastest exact kernel and those whose 95% interval of the median overlaps its own: "
                     "not ranked")
    notes += unshown_failures(records, shown) + grouped_note(records) + cpu_notes(records)
    if approx:
        rates = "dense-equivalent rates, " if metric in ("tflops", "gbps") else ""
        where = f"'{approx_column}'" if approx_column else "approximate kernels"
        notes.append(f"{where}: {rates}never marked fastest: {', '.join(approx)}")
    shared = defaultdict(list)
    for b, col in merged.items():
        if b != col:
            shared[col].append(b.removeprefix(col))
    if shared:
        notes.append("one column, the best of a kernel's API forms: "
                     + "; ".join(f"{col} = {col}, {', '.join(others)}" for col, others in shared.items()))
    for status, reason, n, names in reason_groups([r for r in records if r.status != "ok"]):
        notes.append(f"{n} {status}: {reason + ' ' if reason else ''}({listed(names)})")
    return legend, notes


def header_lines(name: str, width: int | None = None) -> str:
    """A column title within ``width`` (default: ``column_width``) characters a line: split at the first
    hyphen, each part cut to fit."""
    width = width or column_width(name)
    if len(name) <= width:
        return name
    head, _, rest = name.partition("-")
    parts = [head, rest] if rest else [head]
    return "\n".join(p if len(p) <= width else p[: width - 1] + "…" for p in parts)


def render(summary: Summary, console) -> None:
    """Print the summary with rich (``console`` sets the width): one table per panel of columns, the
    groups one below the other, each named in the first column."""
    from rich import box
    from rich.table import Table

    from attnbench.report.safe_text import escaped_summary
    summary = escaped_summary(summary)  # names from traces and stores are shown, not read as markup
    console.print(summary.header, highlight=False, markup=False)
    for pivot in summary.pivots:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0), pad_edge=False, collapse_padding=True)
        grouped = any(g.title for g in pivot.groups)
        if grouped:
            table.add_column("", justify="left", no_wrap=True, style="bold")
        label_width = max([len(r) for g in pivot.groups for r in g.rows] + [1])
        table.add_column(ROW_TITLES.get(pivot.row_axis, pivot.row_axis), justify="right", no_wrap=True,
                         min_width=label_width)
        for col in pivot.columns:
            table.add_column(header_lines(col), justify="right", no_wrap=True, min_width=column_width(col),
                             max_width=column_width(col))
        if pivot.approx_column:
            table.add_column(" " + pivot.approx_column, justify="left", no_wrap=True, overflow="ellipsis")
        for gi, group in enumerate(pivot.groups):
            for i, row in enumerate(group.rows):
                cells = [group.cells.get((row, c), Cell("")) for c in pivot.columns]
                texts = [f"[bold]{c.text}[/]" if c.best else c.text for c in cells]
                if pivot.approx_column:
                    texts.append(" " + group.cells.get((row, pivot.approx_column), Cell("")).text)
                label = _group_label(group.title, i, len(group.rows))
                table.add_row(*([label] if grouped else []), row, *texts,
                              end_section=i == len(group.rows) - 1 and gi < len(pivot.groups) - 1)
        console.print(table)
    for note in legend_lines(summary.legend, console.width) + summary.notes:
        console.print(note, highlight=False, markup=False, overflow="fold")


def legend_lines(items: list[str], width: int) -> list[str]:
    """The legend's items on as few lines of ``width`` as they fill, LEGEND_GAP apart, none cut in two."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(LEGEND_GAP) + len(item) <= width:
            lines[-1] += LEGEND_GAP + item
        else:
            lines.append(item)
    return lines


def _group_label(title: tuple[str, ...], i: int, n: int) -> str:
    """The group's values stacked down its first rows (all on the last row when there are more values)."""
    if len(title) <= n:
        return title[i] if i < len(title) else ""
    return " ".join(title) if i == 0 else ""

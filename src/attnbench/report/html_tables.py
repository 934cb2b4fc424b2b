"""The HTML report's tables: the answer (summary pivot), correctness per backend, what did not run,
accuracy in numbers, every record (sortable and filterable in the page), the environment in human units.

Every piece of text from the store is escaped here; ``Raw`` marks markup this module built itself.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from attnbench import metrics
from attnbench.report import footnotes, grid, summary
from attnbench.report.safe_text import html as escape
from attnbench.results.record import FAILED_VERDICTS, Record, clock_of, verdict_of


class Raw(str):
    """Markup built (and escaped) by this module."""


def num(value) -> str:
    """Three significant digits or more, never scientific for everyday magnitudes (0.000123, 12.3, 1234)."""
    if value is None:
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.3g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{min(digits, 8)}f}"


def table(headers: list[str], rows: list[list], numeric: set[int] = frozenset(), cls: str = "",
          sortable: bool = False) -> str:
    """An HTML table; cells are escaped unless ``Raw``. Headers that name nothing (a list of keys and values)
    make no header row."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    num_attr = ' class="num"'
    for row in rows:
        cells = "".join(f"<td{num_attr if i in numeric else ''}>{c if isinstance(c, Raw) else escape(str(c))}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    extra = ' data-sortable="1"' if sortable else ""
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f'<table class="{cls}"{extra}>{thead}<tbody>{"".join(body)}</tbody></table>'


def span(cls: str, text: str, title: str = "") -> Raw:
    tip = f' title="{escape(title)}"' if title else ""
    return Raw(f'<span class="{escape(cls)}"{tip}>{escape(text)}</span>')


def pivot_html(built: summary.Summary) -> str:
    """The summary pivots as HTML tables: groups one below the other, the fastest exact kernel marked."""
    parts = []
    approx = set(built.approx)
    for pivot in built.pivots:
        titled = any(group.title for group in pivot.groups)  # no group names: no column for them
        heads = [""] * titled + [summary.ROW_TITLES.get(pivot.row_axis, pivot.row_axis),
                                 *(f"{c} ≈" if c in approx else c for c in pivot.columns)]
        if pivot.approx_column:
            heads.append(pivot.approx_column + " ≈")
        rows = []
        for group in pivot.groups:
            for i, row in enumerate(group.rows):
                cells = [Raw("<br>".join(f"<b>{escape(t)}</b>" for t in group.title)) if i == 0 else ""] * titled
                cells.append(row)
                for col in pivot.columns:
                    cell = group.cells.get((row, col), summary.Cell(""))
                    cells.append(Raw(f'<b class="best">{escape(cell.text)}</b>') if cell.best else cell.text)
                if pivot.approx_column:
                    cells.append(group.cells.get((row, pivot.approx_column), summary.Cell("")).text)
                rows.append(cells)
        parts.append(table(heads, rows, numeric=set(range(int(titled), len(heads))), cls="pivot"))
    notes = "".join(f"<li>{escape(n)}</li>" for n in built.legend + built.notes)  # a mark's meaning an item each
    return "".join(parts) + f'<ul class="notes">{notes}</ul>'


def correctness(records: list[Record]) -> str:
    """Per backend: how many cases were checked, passed and failed, and the worst error / limit."""
    by = defaultdict(list)
    for r in records:
        by[r.backend].append(r)
    rows = []
    for backend, recs in by.items():
        checked = [r for r in recs if r.accuracy]
        verdicts = Counter(verdict_of(r.status, r.accuracy) for r in checked)
        worst = max(((grid.worst(r) or 0.0, r) for r in checked), key=lambda t: t[0], default=(None, None))
        bad = verdicts.get("fail", 0) + verdicts.get("approx-fail", 0) + verdicts.get("nan", 0)
        word = "-" if not checked else ("fails" if bad else "correct")
        rows.append([backend, _judged_as(checked), len(checked), sum(n for v, n in verdicts.items() if "pass" in v),
                     bad, num(worst[0]), _case_name(worst[1]) if worst[1] else "-",
                     span("fail" if bad else "pass" if checked else "muted", word)])
    rows.sort(key=lambda r: (r[4] == 0, r[0]))
    return table(["backend", "judged as", "checked", "passed", "failed", "worst error / limit", "worst case",
                  "verdict"], rows, numeric={2, 3, 4, 5}, cls="correct")


def _judged_as(checked: list[Record]) -> str:
    """exact, approximate, or how many of each where a backend has both (its fp8 cases approximately)."""
    approx = sum(not summary.is_exact(r) for r in checked)
    if not approx:
        return "exact"
    return "approximate" if approx == len(checked) else f"exact ({approx} of {len(checked)} approximately)"


def _case_name(r: Record) -> str:
    """A case as its tables name it: a trace's step by its name too."""
    name = (r.info or {}).get("batch_name")
    return (f"{name}: " if name else "") + r.spec.label() + " " + r.spec.pass_


def verdict_line(records: list[Record]) -> Raw:
    """Correctness in one sentence, for the top of the page."""
    checked = [r for r in records if r.accuracy]
    if not checked:
        return Raw('<span class="unchecked">No case was checked for accuracy (run without --no-check).</span>')
    bad = defaultdict(int)
    for r in checked:
        if verdict_of(r.status, r.accuracy) in FAILED_VERDICTS:
            bad[r.backend] += 1
    exact_bad = [b for b in bad if any(summary.is_exact(r) for r in checked if r.backend == b)]
    worst = max((grid.worst(r) or 0.0) for r in checked if r.backend not in bad) if len(bad) < len(
        {r.backend for r in checked}) else None
    backends = len({r.backend for r in checked})
    parts = [f"Accuracy: {backends - len(bad)} of {backends} backends pass every checked case"
             + (f" (worst error at {worst:.2f} of its limit)" if worst is not None else "")]
    if exact_bad:
        parts.append(f'<span class="fail">exact kernels that fail: {escape(", ".join(exact_bad))}</span>')
    approx_bad = [b for b in bad if b not in exact_bad]
    if approx_bad:
        parts.append(f'<span class="approx-fail">approximate kernels outside their looser limits: '
                     f'{escape(", ".join(f"{b} ({bad[b]} cases)" for b in approx_bad))}</span>')
    return Raw("; ".join(parts) + ".")


def not_run(records: list[Record]) -> str:
    """Cases without a result, grouped by status and reason, with counts and the backends concerned."""
    groups = footnotes.reason_groups([r for r in records if r.status not in ("ok", "mismatch")])
    if not groups:
        return '<p class="muted">Every case ran.</p>'
    rows = [[span(status, status), n, reason, ", ".join(backends)] for status, reason, n, backends in groups]
    return table(["status", "cases", "reason", "backends"], rows, numeric={1}, cls="skipped")


ACC_TENSORS = ("out", "dq", "dk", "dv")


def accuracy_numbers(records: list[Record]) -> str:
    """One row per checked record: verdict, worst error / limit, max abs error and cosine of each tensor."""
    rows = []
    for r in records:
        acc = r.accuracy
        if not acc:
            continue
        tensors = acc.get("tensors") or {}
        verdict = verdict_of(r.status, acc)
        cells = [r.backend, r.spec.label(), r.spec.pass_, span(verdict, verdict, acc.get("reason") or ""),
                 num(grid.worst(r))]
        for name in ACC_TENSORS:
            m = tensors.get(name) or {}
            cells += [num(m.get("max_abs")), "-" if m.get("cosine") is None else f"{m['cosine']:.5f}"]
        rows.append(cells)
    if not rows:
        return '<p class="muted">No accuracy checks in this run.</p>'
    heads = ["backend", "case", "pass", "verdict", "worst / limit"]
    for name in ACC_TENSORS:
        heads += [f"{name} max abs", f"{name} cosine"]
    return table(heads, rows, numeric=set(range(4, len(heads))), cls="accuracy", sortable=True)


def records_html(records: list[Record]) -> str:
    """Every record, sortable (click a column) and filterable (the box above it)."""
    with_clock = any(clock_of(r.info)[0] is not None for r in records)
    unit = metrics.rate_unit(r.tflops for r in records if r.status == "ok")  # the summary's unit, in words
    rows = []
    for r in records:
        mhz, dropped = clock_of(r.info)
        verdict = verdict_of(r.status, r.accuracy)
        mem = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
        cells = [r.backend, r.spec.label(), r.spec.pass_, num(r.median_ms),
                 num(None if r.tflops is None else r.tflops * unit.factor), num(r.gbps),
                 "n/a" if mem is None else f"{mem:.1f}"]
        if with_clock:
            cells.append(span("dropped", f"{mhz}↓", "SM clock fell by more than 10% during the timed calls")
                         if dropped else ("-" if mhz is None else str(mhz)))
        cells += [span(verdict, verdict), span(r.status, r.status, r.reason or "")]
        rows.append(cells)
    heads = ["backend", "case", "pass", "median ms", unit.name, "GB/s", "peak MiB", *(["SM MHz"] if with_clock else []),
             "accuracy", "status"]
    return ('<input class="filter" type="search" placeholder="filter rows (e.g. fa3 causal fwd_bwd)">'
            + table(heads, rows, numeric=set(range(3, 8 if with_clock else 7)), cls="results", sortable=True))


def environment(env: dict | None) -> str:
    """The recorded environment in a few human lines."""
    if not env:
        return '<p class="muted">No environment recorded.</p>'
    mem = env.get("device_memory_bytes")
    gpu = env.get("gpu") or {}
    items = [("device", " ".join(str(x) for x in (env.get("device_name"), f"({mem / 2**30:.0f} GiB)" if mem else "")
                                 if x)),
             ("driver / CUDA / cuDNN", " / ".join(str(env.get(k) or gpu.get(k) or "-") for k in ("driver", "cuda", "cudnn"))),
             ("clocks and power", f"max SM {gpu['max_sm_clock_mhz']} MHz, limit {gpu.get('power_limit_w', '?')} W"
              if gpu.get("max_sm_clock_mhz") else ""),
             ("software", ", ".join(f"{k} {env[k]}" for k in ("torch", "python", "attnbench") if env.get(k))),
             ("packages", ", ".join(f"{k} {v}" for k, v in sorted((env.get("packages") or {}).items()))),
             ("host", ", ".join(str(env[k]) for k in ("os", "cpu", "hostname") if env.get(k)))]
    return table(["", ""], [[k, v] for k, v in items if v], cls="env")

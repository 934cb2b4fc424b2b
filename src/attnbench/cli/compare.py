"""`attnbench compare RUN_A RUN_B` (speed ratios with confidence intervals, for CI checks) and `merge`."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand

from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.cli.view import open_store, resolve_run
from attnbench.results import compare as cmp
from attnbench.results import merge as mergemod


class PlainUsage(TyperCommand):
    """A usage line that names required arguments as click does (``RUN_A RUN_B``), not in typer's braces, which
    read like a format string's placeholders (``{run_a} {run_b}``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


VERDICT_STYLE = {"regression": "bold red", "slower": "yellow", "same": "dim", "faster": "green",
                 "inconclusive": "cyan", cmp.BUSY: "cyan", "no-ci": "dim", "status": "magenta"}
SHOWN = {cmp.BUSY: "busy CPU"}
"""A verdict as the table and the summary line write it, where that is not its name."""


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


ORDER = {"regression": 0, "slower": 1, "status": 2, "inconclusive": 3, cmp.BUSY: 4, "no-ci": 5, "same": 6,
         "faster": 7}


def comparison_table(result: cmp.Comparison, run_a: str, run_b: str) -> Table:
    """One row per case, worst first; a verdict word per row (why an ``inconclusive`` one is, in the footnotes
    ``why_lines`` counts), so the table fits 100 columns."""
    pct = round(result.confidence * 100)
    table = Table(title=f"B = {run_b} vs A = {run_a}: B/A time ratio (> 1: B slower)",
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("backend", "left"), ("case", "left"), ("pass", "left"), ("A ms", "right"),
                          ("B ms", "right"), ("B/A", "right"), (f"{pct}% CI", "right"), ("verdict", "left")):
        table.add_column(name, justify=justify, no_wrap=name not in ("case", "backend"), overflow="fold")
    for c in sorted(result.cases, key=lambda c: (ORDER[c.verdict], -(c.ratio or 0))):
        ci = "-" if c.low is None else f"{_ratio(c.low)}–{_ratio(c.high)}"
        verdict = f"{c.status_a} → {c.status_b}" if c.verdict == "status" else SHOWN.get(c.verdict, c.verdict)
        table.add_row(escape(c.backend), escape(c.label), c.pass_, _fmt(c.a_ms, ".4g"), _fmt(c.b_ms, ".4g"),
                      _ratio(c.ratio), ci, f"[{VERDICT_STYLE[c.verdict]}]{escape(verdict)}[/]")
    return table


def why_lines(result: cmp.Comparison) -> list[str]:
    """Why cases are inconclusive, one line per reason with its count."""
    reasons = Counter(c.why for c in result.cases if c.verdict == "inconclusive")
    return [f"inconclusive, {n}: {why}" for why, n in reasons.most_common()]


def compare(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="Baseline run id (or unique prefix).")],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="Run to compare with the baseline.")],
    db: common.Db = None,
    fail_on_regression: Annotated[str | None, typer.Option(
        "--fail-on-regression", help="Exit 1 when a case is clearly slower by more than this, e.g. 5%.")] = None,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
) -> None:
    """Per-case speed of run B against run A, with bootstrap confidence intervals from the raw samples."""
    try:
        threshold = cmp.parse_threshold(fail_on_regression if fail_on_regression is not None else "5%")
        with open_store(db) as store:
            a, b = resolve_run(store, run_a), resolve_run(store, run_b)
            rows_a, rows_b = store.rows(a), store.rows(b)
            unfinished = [f"{r} is {store.run(r)['status']}" for r in dict.fromkeys((a, b))
                          if store.run(r)["status"] != "done"]
        result = cmp.compare(rows_a, rows_b, threshold=threshold, confidence=confidence)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not result.cases:
        raise UserError(f"runs {a} and {b} have no case in common (cases match by spec, backend and timing mode)")
    common.console.print(comparison_table(result, a, b))
    for line in why_lines(result):
        common.console.print(line, highlight=False, markup=False)
    counts = {v: sum(c.verdict == v for c in result.cases) for v in VERDICT_STYLE}
    summary = ", ".join(f"{n} {SHOWN.get(v, v)}" for v, n in counts.items() if n)
    extra = f"; only in A: {len(result.only_a)}, only in B: {len(result.only_b)}" if result.only_a or result.only_b else ""
    common.console.print(f"{len(result.cases)} cases: {summary} (regression = CI above +{threshold:.0%}){extra}",
                         highlight=False, markup=False)
    if counts[cmp.BUSY]:  # other processes move a CPU timing both ways: these say nothing of the code
        common.console.print(f"busy CPU, {counts[cmp.BUSY]}: not comparable (other processes took cores while "
                             "they were timed)", highlight=False, markup=False)
    if unfinished:  # an interrupted run lacks cases: "only in" counts partly mean "not measured yet"
        common.console.print(f"note: run {'; run '.join(unfinished)} (attnbench run --resume completes it)",
                             highlight=False, markup=False)
    if fail_on_regression is not None and result.regressions:
        worst = max(result.regressions, key=lambda c: c.low)
        common.err_console.print(
            f"attnbench: {len(result.regressions)} regression(s) beyond {threshold:.0%}; worst: {worst.backend} "
            f"{worst.label} {worst.pass_} x{worst.ratio:.3f} (CI {worst.low:.3f}–{worst.high:.3f})",
            highlight=False, markup=False, soft_wrap=True)
        raise SystemExit(1)


def merge(
    output: Annotated[Path, typer.Argument(metavar="OUTPUT", help="Database to write (created, or added to).")],
    inputs: Annotated[list[Path], typer.Argument(
        metavar="INPUT", help="Databases to copy in, e.g. the rank files of a sweep.")],
) -> None:
    """Combine result databases (e.g. one per GPU of a sharded sweep) into one."""
    missing = [str(p) for p in inputs if not p.is_file()]
    if missing:
        raise UserError(f"no such database: {', '.join(missing)}")
    try:
        summary = mergemod.merge(output, inputs)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    runs = ", ".join(f"{r} ({n} file{'s' if n > 1 else ''})" for r, n in summary.runs.items()) or "none"
    dup = f"; {summary.duplicates} already present" if summary.duplicates else ""
    common.console.print(f"merged {summary.records} records into {output}{dup}; runs: {runs}",
                         highlight=False, markup=False)
    for path, old, new in summary.renamed:
        common.console.print(f"run {old} of {path} is another run than the {old} already merged (the same cases "
                             f"with other records): kept apart as {new}", highlight=False, markup=False)

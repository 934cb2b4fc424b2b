"""One self-contained HTML report of runs: environment, results, accuracy, skipped cases, plots.

Everything is inline (CSS, PNG plots as base64 data URIs): the file opens offline and can be mailed
or attached to CI artifacts. Every piece of text from the store is escaped.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from html import escape

from attnbench.report import plots
from attnbench.results.record import clock_of, verdict_of

log = logging.getLogger(__name__)

SKIPPED = ("unsupported", "oom", "error", "nan", "implausible")
ENV_FIELDS = ("device_name", "device", "platform", "compute_capability", "sm_count", "device_memory_bytes",
              "driver", "cuda", "hip", "cudnn", "torch", "python", "attnbench", "git_sha", "os", "hostname", "cpu",
              "cpu_threads", "torch_threads")
PLOT_Y = ("ms", "tflops", "mem")
"""Metrics drawn in reports (GB/s is in the tables; `attnbench plot --y gbps` draws it)."""
PLOT_DPI = 80

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:1.6em}h3{margin-top:1.2em}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}
.ok{color:#17702a}.unsupported{color:#777}.oom{color:#9a6700}.error,.nan,.mismatch,.implausible,.fail,.approx-fail{color:#b3261e}.unchecked{color:#9a6700;font-style:italic}.dropped{color:#9a6700;font-weight:bold}
.pass{color:#17702a}.plots{display:flex;flex-wrap:wrap;gap:12px}figure{margin:6px 0 18px}img{max-width:100%;border:1px solid #e2e2e2}
.muted{color:#666}code{font-size:12px}
"""


def _num(value) -> str:
    """Three significant digits or more, never scientific for everyday magnitudes (0.000123, 12.3, 1234)."""
    if value is None:
        return "-"
    value = float(value)
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.3g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{min(digits, 8)}f}"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset(), cls: str = "") -> str:
    """HTML table; cells are escaped here, except pre-built ones passed as ``_Raw``."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            attr = ' class="num"' if i in numeric else ""
            cells.append(f"<td{attr}>{cell if isinstance(cell, _Raw) else escape(str(cell))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


class _Raw(str):
    """Markup built (and escaped) by this module."""


def _status(row: dict) -> _Raw:
    return _Raw(f'<span class="{escape(row["status"])}">{escape(row["status"])}</span>')


def _accuracy(row: dict) -> dict | None:
    value = row.get("accuracy")
    return json.loads(value) if isinstance(value, str) else value


def _mem(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


def _clock(info) -> _Raw:
    mhz, dropped = clock_of(info)
    if mhz is None:
        return _Raw("-")
    return _Raw(f'<span class="dropped" title="SM clock fell by more than 10% during the timed calls">{mhz}↓</span>'
                if dropped else str(mhz))


def results_table(rows: list[dict]) -> str:
    """One row per record; an SM MHz column (the clock at the end of the timed calls) for GPU runs."""
    with_clock = any(clock_of(r.get("info"))[0] is not None for r in rows)
    body = []
    for r in rows:
        verdict = verdict_of(r["status"], _accuracy(r))
        body.append([r["backend"], r["label"], r["pass"], _num(r["median_ms"]), _num(r["tflops"]),
                     _num(r["gbps"]), _mem(r["peak_mem_bytes"]), *([_clock(r.get("info"))] if with_clock else []),
                     _Raw(f'<span class="{escape(str(verdict))}">{escape(str(verdict))}</span>'), _status(r)])
    headers = ["backend", "case", "pass", "median ms", "TFLOP/s", "GB/s", "peak MiB",
               *(["SM MHz"] if with_clock else []), "accuracy", "status"]
    return _table(headers, body, numeric={3, 4, 5, 6, 7} if with_clock else {3, 4, 5, 6}, cls="results")


def _metrics_text(acc: dict) -> str:
    parts = []
    for key, value in acc.items():
        if key in ("verdict", "reason"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
            parts.append(f"{key}: {inner}")
        else:
            parts.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
    return "; ".join(parts)


def accuracy_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        acc = _accuracy(r)
        if not acc:
            continue
        verdict = str(acc.get("verdict", "-"))
        body.append([r["backend"], r["label"], r["pass"], _Raw(f'<span class="{escape(verdict)}">{escape(verdict)}</span>'),
                     acc.get("reason") or "", _metrics_text(acc)])
    if not body:
        return '<p class="muted">No accuracy checks in this run (run with an accuracy check to get verdicts).</p>'
    return _table(["backend", "case", "pass", "verdict", "reason", "metrics"], body, cls="accuracy")


def skipped_table(rows: list[dict]) -> str:
    body = [[r["backend"], r["label"], r["pass"], _status(r), r.get("reason") or ""]
            for r in rows if r["status"] in SKIPPED]
    if not body:
        return '<p class="muted">No case was skipped.</p>'
    return _table(["backend", "case", "pass", "status", "reason"], body, cls="skipped")


def env_table(env: dict | None) -> str:
    if not env:
        return '<p class="muted">No environment recorded.</p>'
    rows = [[k, str(env[k])] for k in ENV_FIELDS if env.get(k) not in (None, "")]
    packages = env.get("packages") or {}
    if packages:
        rows.append(["packages", ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))])
    return _table(["field", "value"], rows, cls="env")


def plot_axes(rows: list[dict]) -> list[str]:
    """The x axes worth drawing for these rows: those taking several values among successful records."""
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for x in plots.X_AXES:
        values = {plots.x_value(r, x) for r in ok} - {None}
        if len(values) > 1:
            out.append(x)
    return out


def figures(rows: list[dict], title_prefix: str = "") -> list[str]:
    """<figure> elements with base64 PNG plots for each worthwhile (x, y)."""
    out = []
    for x in plot_axes(rows):
        for y in PLOT_Y:
            try:
                png = plots.render(rows, x, y, "png", dpi=PLOT_DPI, title=f"{title_prefix}{plots.Y_AXES[y][1]} vs {plots.X_AXES[x][1]}")
            except ValueError as exc:  # e.g. no memory numbers on CPU: say nothing, the table shows n/a
                log.debug("no %s vs %s plot: %s", y, x, exc)
                continue
            data = base64.b64encode(png).decode("ascii")
            caption = escape(f"{plots.Y_AXES[y][1]} vs {plots.X_AXES[x][1]}")
            out.append(f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{caption}</figcaption></figure>")
    return out


def run_section(run: dict, rows: list[dict], env: dict | None) -> str:
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run["created_at"])) if run.get("created_at") else "?"
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no records"
    meta = _table(["run", "status", "started", "records", "command"],
                  [[run["run_id"], run.get("status") or "?", started, summary, run.get("command") or ""]], cls="run")
    figs = figures(rows, title_prefix=f"{run['run_id']}: ")
    parts = [f'<section class="run" id="run-{escape(run["run_id"])}">', f"<h2>Run {escape(run['run_id'])}</h2>",
             meta, "<h3>Environment</h3>", env_table(env),
             "<h3>Plots</h3>", f'<div class="plots">{"".join(figs)}</div>' if figs
             else '<p class="muted">Nothing varies enough to plot.</p>',
             "<h3>Results</h3>", results_table(rows),
             "<h3>Accuracy</h3>", accuracy_table(rows), "<h3>Skipped cases</h3>", skipped_table(rows), "</section>"]
    return "\n".join(parts)


def build(store, run_ids: list[str]) -> str:
    """The whole report for ``run_ids`` (which must exist in ``store``) as an HTML string."""
    sections = []
    for run_id in run_ids:
        run = store.run(run_id) or {"run_id": run_id}
        env = store.env(run["env_id"]) if run.get("env_id") else None
        sections.append(run_section(run, store.rows(run_id), env))
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    title = "attnbench report: " + ", ".join(run_ids)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
            f'<p class="muted">Generated {escape(made)} from {escape(str(store.path))}. Times are medians per call; '
            "TFLOP/s and GB/s follow the FLOP and byte conventions in attnbench.metrics.</p>"
            + "\n".join(sections) + "</body></html>\n")

"""One self-contained HTML report of runs, answer first.

Per run: which kernel is fastest at each shape and whether each kernel is correct (the summary pivot and
a correctness table), speedups against a baseline, the figures, what did not run (grouped by reason),
accuracy in numbers, every record (sortable and filterable in the page) and the environment last.
Everything is inline (CSS, a small script, SVG figures as data URIs): the file opens offline, loads
nothing, and can be mailed or kept as a CI artifact. Every piece of text from the store is escaped.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse

from attnbench.report import html_tables as ht
from attnbench.report import plots, summary
from attnbench.report.safe_text import html as escape
from attnbench.results.record import Record

log = logging.getLogger(__name__)

PLOT_Y = ("tflops", "ms", "mem")
"""Metrics drawn in reports (GB/s is in the tables; `attnbench plot --y gbps` draws it)."""
PLOT_FORMAT = "svg"
"""Figures are SVG, drawn the width of the page: sharp at any width and smaller than PNGs as sharp. The H100
default sweep's twelve figures (2026-11-26): 2.4 MB as matplotlib's SVG in base64, 1.0 MB with text as text,
written compactly (``plots.compact_svg``) in a %-escaped data URI (``svg_uri``)."""
BASELINES = ("naive", "sdpa-math", "sdpa-flash")
"""The speedup table's baseline where the run names none (``--baseline``): the first of these in the run."""
PIVOT_WIDTH = 150
"""Characters the report's pivots are laid out for (a page holds more columns than a terminal)."""


def baseline_of(run: dict, present: set[str]) -> str | None:
    """The backend a run's speedups are against: its own ``--baseline`` where it gave one that has results, else
    the first of BASELINES it ran; None when none."""
    try:
        config = json.loads(run.get("config") or "{}")
    except (TypeError, ValueError):
        config = {}
    given = config.get("baseline") if isinstance(config, dict) else None
    if isinstance(given, str) and given in present:
        return given
    return next((b for b in BASELINES if b in present), None)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1b1b;background:#fff;max-width:1400px}
h1{font-size:1.45em;margin-bottom:4px}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:1.6em}h3{margin-top:1.3em}
table{border-collapse:collapse;margin:8px 0 12px;font-size:13px}
th,td{border:1px solid #d6d6d6;padding:2px 7px;text-align:left;vertical-align:top}
th{background:#eef2f7;position:sticky;top:0}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.pivot{font-size:12px}table.pivot td,table.pivot th{padding:1px 5px}.best{color:#0b5cad}
table[data-sortable] th{cursor:pointer}table[data-sortable] th:hover{background:#dde5ef}
.ok,.pass,.approx-pass{color:#17702a}.unsupported,.muted{color:#777}.oom,.unchecked,.dropped{color:#9a6700}
.error,.nan,.mismatch,.implausible,.fail,.approx-fail{color:#b3261e;font-weight:bold}
.plots figure{margin:6px 0 18px}.plots img{width:100%;height:auto;border:1px solid #e2e2e2}
.lead{font-size:15px;margin:4px 0 10px}.lead code,details.command code{overflow-wrap:anywhere}
details.command{font-size:13px;margin:-6px 0 10px}.notes{font-size:13px;color:#444;margin-top:0}
input.filter{margin:6px 0;padding:4px 8px;width:28em;font-size:13px}details>summary{cursor:pointer;font-weight:bold}
"""

SCRIPT = """
document.querySelectorAll('table[data-sortable]').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
    var rows=Array.from(t.tBodies[0].rows),asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
    function key(r){var s=r.cells[i].textContent.trim(),n=parseFloat(s);return isNaN(n)?s:n;}
    rows.sort(function(a,b){var x=key(a),y=key(b);if(typeof x!==typeof y){x=String(x);y=String(y);}
      return (x<y?-1:x>y?1:0)*(asc?1:-1);});
    rows.forEach(function(r){t.tBodies[0].appendChild(r);});});});});
document.querySelectorAll('input.filter').forEach(function(box){
  var t=box.nextElementSibling;box.addEventListener('input',function(){
    var words=box.value.toLowerCase().split(/\\s+/).filter(Boolean);
    Array.from(t.tBodies[0].rows).forEach(function(r){var s=r.textContent.toLowerCase();
      r.style.display=words.every(function(w){return s.indexOf(w)>=0;})?'':'none';});});});
"""


def figures(rows: list[dict], context: str) -> list[str]:
    """<figure> elements with SVG plots: per varying x axis and metric, one figure per set of backends
    (exact kernels, approximate ones, API forms), each with a readable number of lines."""
    out = []
    unit = plots.rate_unit(rows)  # one for the run's figures, as for its tables
    for x in plots.plot_axes(rows):
        for y in PLOT_Y:
            for name, subset in plots.backend_sets(rows):
                xlabel = plots.x_label(x, any(plots.operator_of(r) == "attention" for r in subset))
                title = f"{plots.y_label(y, unit)} vs {xlabel}: {name}\n{context}"
                try:
                    image = plots.render(subset, x, y, PLOT_FORMAT, title=title, unit=unit)
                except ValueError as exc:  # e.g. no memory numbers on CPU: the table shows n/a
                    log.debug("no %s vs %s plot: %s", y, x, exc)
                    continue
                caption = escape(f"{plots.y_label(y, unit)} vs {xlabel}: {name}")
                out.append(f'<figure><img alt="{caption}" src="{svg_uri(image)}">'
                           f"<figcaption>{caption}</figcaption></figure>")
    return out


_URI_SAFE = " '<>/=:;,.-_()!*~+?@[]{}|^`$"
"""What a figure's data URI keeps as it is: everything but %, #, &, the double quote, line breaks and
non-ASCII, which are %-escaped (a browser reads < and > in a quoted attribute as they are)."""


def svg_uri(svg: bytes) -> str:
    """A data: URI of an SVG, readable inside a double-quoted attribute: the tags' double quotes become single
    ones (``plots.compact_svg`` leaves none of those in them) and only what must be is %-escaped, so the URI
    is hardly longer than the SVG (base64 made it a third longer)."""
    text = svg.decode()
    tags = re.sub(r"<[^>]*>", lambda m: m[0].replace('"', "'"), text)
    if not any("'" in tag for tag in re.findall(r"<[^>]*>", text)):
        text = tags  # else (an apostrophe inside an attribute) the double quotes stay, %-escaped
    return "data:image/svg+xml," + urllib.parse.quote(text, safe=_URI_SAFE)


def timed_once(rows: list[dict]) -> bool:
    """Every timed record holds one call (``verify``'s default): nothing a figure should draw a line through."""
    drawn = [r for r in rows if r.get("status") in plots.DRAWN_STATUSES]
    return bool(drawn) and all((r.get("n") or 0) <= 1 for r in drawn)


COMMAND_SHOWN = 300
"""Characters of a run's command on its line; a longer one (a grouped sweep's 256-sequence --seq-lens) folds."""


def command_html(command: str) -> str:
    """The run's command closing its lead line; one longer than ``COMMAND_SHOWN`` is cut there, whole under a
    fold below (it wraps at any character, never widening the page)."""
    if len(command) <= COMMAND_SHOWN:
        return f"<code>{escape(command)}</code></p>"
    return (f"<code>{escape(command[:COMMAND_SHOWN])}…</code></p>"
            f'<details class="command"><summary>the whole command ({len(command):,} characters)</summary>'
            f"<code>{escape(command)}</code></details>")


def run_section(run: dict, rows: list[dict], env: dict | None) -> str:
    records = [Record.from_row(r) for r in rows]
    run_id = run["run_id"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run["created_at"])) if run.get("created_at") else "?"
    device = (env or {}).get("device_name") or "?"
    ok = sum(r.status == "ok" for r in records)
    parts = [f'<section class="run" id="run-{escape(run_id)}">', f"<h2>Run {escape(run_id)}</h2>",
             f'<p class="lead">{escape(device)} · {escape(started)} · run {escape(run.get("status") or "?")} · '
             f"{ok} of {max(run.get('cases') or 0, len(records))} cases ran · {command_html(run.get('command') or '')}"]
    if not records:
        return "\n".join([*parts, '<p class="muted">No records.</p></section>'])
    answer = summary.build(records, device=device, width=PIVOT_WIDTH)
    parts.append(f'<p class="lead">{ht.verdict_line(records)}</p>')
    context = " · ".join(x for x in (answer.shape, (env or {}).get("device_name")) if x)
    if timed_once(rows):  # verify's single cold call per case: no speed to compare, no line to draw
        parts += ["<h3>Is it correct?</h3>", ht.correctness(records), "<h3>Speed</h3>",
                  '<p class="muted">Every case was timed once (as verify does, to check it): no speeds or figures; '
                  "attnbench run times them.</p>"]
    else:
        parts += [f"<h3>Fastest kernel per shape ({escape(answer.unit)})</h3>", ht.pivot_html(answer),
                  "<h3>Is it correct?</h3>", ht.correctness(records)]
        present = {r.backend for r in records if r.status == "ok"}
        base = baseline_of(run, present)
        if base:
            parts += [f"<h3>Speedup over {escape(base)} (its time / the kernel's)</h3>",
                      ht.pivot_html(summary.build(records, metric="speedup", baseline=base, device=device,
                                                  width=PIVOT_WIDTH))]
        figs = figures(rows, context)
        parts += ["<h3>Figures</h3>", f'<div class="plots">{"".join(figs)}</div>' if figs else
                  f'<p class="muted">{escape(plots.why_no_plot(rows))}</p>']
    parts += ["<h3>What did not run</h3>", ht.not_run(records),
              "<details><summary>Accuracy of every checked case</summary>", ht.accuracy_numbers(records), "</details>",
              "<details><summary>Every record</summary>", ht.records_html(records), "</details>",
              "<h3>Environment</h3>", ht.environment(env), "</section>"]
    return "\n".join(parts)


def build(store, run_ids: list[str]) -> str:
    """The whole report for ``run_ids`` (which must exist in ``store``) as an HTML string."""
    from attnbench import operators

    sections, present = [], set()
    for run_id in run_ids:
        run = store.run(run_id) or {"run_id": run_id}
        env = store.env(run["env_id"]) if run.get("env_id") else None
        rows = store.rows(run_id)
        present |= {plots.operator_of(r) for r in rows}
        sections.append(run_section(run, rows, env))
    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    title = "attnbench report: " + ", ".join(run_ids)
    notes = "; ".join(operators.get(name).flop_note for name in operators.OPERATORS if name in (present or
                                                                                                   {"attention"}))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
            f'<p class="muted">Made {escape(made)} from {escape(str(store.path))}. Times are medians per call; '
            f"{escape(notes)}.</p>" + "\n".join(sections) + f"<script>{SCRIPT}</script></body></html>\n")

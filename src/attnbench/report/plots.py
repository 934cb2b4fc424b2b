"""Charts from store rows: one line per backend, one panel per (causal, pass), units on the axes.

Works on record rows as ``ResultStore.rows`` returns them (flat columns, JSON text in ``info``).
Figures are drawn on matplotlib's Agg canvas without pyplot, so nothing global changes and no
display is needed.
"""

from __future__ import annotations

import io
import json
import logging
import re
import textwrap
from collections import defaultdict
from pathlib import Path

from attnbench import features, metrics
from attnbench.report import styles
from attnbench.results.record import busy_of, exact_of, verdict_of
from attnbench.spec import AttnSpec

log = logging.getLogger(__name__)

# --x name -> (store column or None for a computed value, axis label)
X_AXES: dict[str, tuple[str | None, str]] = {
    "seq_len": ("seq_len", "sequence length (tokens)"),
    "kv_seq_len": ("seq_len_k", "key length (tokens)"),
    "num_seqs": ("num_seqs", "sequences per group"),
    "head_size": ("head_dim", "head size"),
    "emb_dim": ("emb_dim", "embedding dim (heads × head size)"),
    "heads": ("heads_q", "query heads"),
    "sparsity": (None, "sparsity (fraction of attention skipped)"),
    "kept": (None, "fraction of (query, key) pairs attended"),
    "new_tokens": ("total_q", "new tokens per batch"),
    "kv_tokens": (None, "KV tokens read per batch"),
}
SERVING_X = ("new_tokens", "kv_tokens")
"""The axes of serving batches (requests of their own new tokens over their own caches): a batch's longest
request or its request count is no size to draw it against."""
SIZE_X = ("seq_len", "kv_seq_len", "num_seqs")
COMPUTED_X = {"sparsity": "sparsity", "kept": "kept_fraction"}
"""Axes read from the record's ``info`` rather than a store column: sparse backends record their
sparsity, every sliding-tile-mask (STA) case the fraction of pairs its mask keeps."""
# --y name -> (store column, axis label, scale applied to the stored value)
Y_AXES: dict[str, tuple[str, str, float]] = {
    "ms": ("median_ms", "median time per call (ms)", 1.0),
    "tflops": ("tflops", "throughput (TFLOP/s)", 1.0),
    "gbps": ("gbps", "bandwidth (GB/s)", 1.0),
    "mem": ("peak_mem_bytes", "peak memory (MiB)", 1.0 / 2**20),
}
LOG2_X = ("seq_len", "kv_seq_len", "num_seqs", "new_tokens", "kv_tokens")
"""Always on a log2 axis; other integer axes are log2 when they span 8x or more."""
PASS_ORDER = ("fwd", "bwd", "fwd_bwd")
LEGEND_COLUMNS = 4
LEGEND_COLUMN_INCHES = 2.2
"""Width one legend column needs (a 20-character label): narrower figures get fewer columns."""
LEGEND_SPACING = 3.5
"""Space between legend columns, in font sizes (matplotlib's 2.0 left items touching where a browser draws an
SVG's text in a wider font than DejaVu Sans, whose widths placed them: Verdana's run about 15% wider)."""
# Columns that, when they vary beyond the x axis, split a backend's points into several lines.
# Columns that may change along each x axis without making a new line (see _series_columns).
ALONG_X: dict[str, set[str]] = {
    "seq_len": {"seq_len_k"}, "kv_seq_len": {"seq_len"},
    "num_seqs": {"seq_len", "seq_len_k", "batch"},  # a recurrence's batch is its sequence count
    "head_size": {"head_dim_v", "emb_dim"}, "emb_dim": {"head_dim", "head_dim_v", "heads_q", "heads_kv"},
    "heads": {"heads_kv", "head_dim", "head_dim_v", "emb_dim"}, "sparsity": set(), "kept": set(),
    "new_tokens": {"seq_len", "seq_len_k", "num_seqs", "total_q"},
    "kv_tokens": {"seq_len", "seq_len_k", "num_seqs", "total_q"},
}
# In order of preference when naming lines; the parts read as the tables write a case (h16/4, keys 4096).
SERIES_COLUMNS = {"run_id": "run {}", "num_seqs": "n{}", "seq_len": "s{}", "_keys": "{}", "batch": "b{}",
                  "heads_q": "h{}", "head_dim": "d{}", "dtype": "{}", "heads_kv": "h{heads_q}/{}",
                  "head_dim_v": "d{head_dim}/{}", "emb_dim": "e{}", "seq_len_k": "keys {}",
                  "_window": "{}", "_variant": "{}", "timing_mode": "{}", "flops_convention": "{}"}
SPLIT_TOGETHER = {"heads_kv": "heads_q", "head_dim_v": "head_dim"}
"""A part that names its partner's value too: the partner is not named again."""


def sparsity(row: dict) -> float | None:
    """Sparsity a sparse backend recorded in ``info`` (``sparsity`` or ``target_sparsity``)."""
    info = row.get("info")
    if isinstance(info, str):
        info = json.loads(info or "{}")
    info = info or {}
    value = info.get("sparsity", info.get("target_sparsity"))
    return None if value is None else float(value)


def _info(row: dict) -> dict:
    info = row.get("info")
    if isinstance(info, str):
        info = json.loads(info or "{}")
    return info or {}


def _spec(row: dict) -> AttnSpec | None:
    spec = row.get("spec")
    if isinstance(spec, str):
        spec = json.loads(spec)
    # the attention case of the row; the plots' attention-only axes (kv tokens, serving) skip other operators
    return AttnSpec.from_dict(spec) if isinstance(spec, dict) and "operator" not in spec else None


def is_serving(row: dict) -> bool:
    """A serving batch: grouped requests whose new tokens are fewer than their keys (decode, prefill over a
    cache), not a grouped training batch of whole sequences."""
    spec = _spec(row)
    return spec is not None and spec.is_varlen and spec.seqlens_q != spec.seqlens_k


def x_value(row: dict, x: str) -> float | None:
    column = X_AXES[x][0]
    if column is not None:
        return row.get(column)
    if x == "sparsity":
        return sparsity(row)
    if x == "kv_tokens":
        spec = _spec(row)
        return None if spec is None else float(metrics.kv_tokens(spec))
    value = _info(row).get(COMPUTED_X[x])
    return None if value is None else float(value)


def y_value(row: dict, y: str, unit: metrics.RateUnit | None = None) -> float | None:
    """The row's ``y`` in the figure's unit (a rate in ``unit``, TFLOP/s unless given)."""
    column, _, scale = Y_AXES[y]
    value = row.get(column)
    if y == "tflops" and unit is not None:
        scale = unit.factor
    return None if value is None else value * scale


def rate_unit(rows: list[dict]) -> metrics.RateUnit:
    """The unit of the FLOP rates of the rows a figure draws (``metrics.rate_unit``: GFLOP/s for a CPU run)."""
    return metrics.rate_unit(r.get("tflops") for r in rows if r.get("status") in DRAWN_STATUSES)


def y_label(y: str, unit: metrics.RateUnit | None = None) -> str:
    """The axis label of ``y``: a rate's in ``unit`` (TFLOP/s unless given)."""
    if y == "tflops":
        return f"throughput ({(unit or metrics.TERA).name})"
    return Y_AXES[y][1]


def check_axes(x: str, y: str) -> None:
    if x not in X_AXES:
        raise ValueError(f"unknown --x {x!r}; allowed: {', '.join(X_AXES)}")
    if y not in Y_AXES:
        raise ValueError(f"unknown --y {y!r}; allowed: {', '.join(Y_AXES)}")


DRAWN_STATUSES = ("ok", "mismatch")
"""Records with a time to draw: a mismatch keeps its time and is drawn marked as failed, never dropped."""
VERDICT_MARKS = {"fail": " [failed check]", "approx-fail": " [failed check]", "unchecked": " [unchecked]"}
"""Suffix that gives failed and unchecked points lines of their own, never mixed with checked ones."""
BUSY_MARK = "?"
"""Drawn beside each point timed while other processes took the CPU (as the tables mark its cell): the point
stays on its backend's line, which a line of its own for the busy points would break into fragments."""
BUSY_NOTE = "?: timed on a busy CPU"


def points(rows: list[dict], x: str, y: str, unit: metrics.RateUnit | None = None) -> list[dict]:
    """Rows that can be drawn (a time, x and y known), each with ``_x``, ``_y`` (a rate in ``unit``, by default
    ``rate_unit`` of the rows) and ``_mark`` added.

    Raises ValueError saying why when nothing can be drawn."""
    check_axes(x, y)
    ok = [dict(r, _mark=VERDICT_MARKS.get(verdict_of(r["status"], r.get("accuracy")), ""),
               _busy=busy_of(r.get("info")))
          for r in rows if r.get("status") in DRAWN_STATUSES]
    if not ok:
        raise ValueError("no timed (status ok or mismatch) records to plot")
    with_x = [dict(r, _x=x_value(r, x)) for r in ok]
    with_x = [r for r in with_x if r["_x"] is not None]
    if not with_x:
        why = {"sparsity": " (only sparse backends record one)",
               "kept": " (only sliding-tile-mask (STA) cases record one)"}.get(x, "")
        raise ValueError(f"no record has a value for --x {x}{why}")
    unit = unit or rate_unit(rows)
    out = [dict(r, _y=y_value(r, y, unit)) for r in with_x]
    out = [dict(r, **_spread(r, y, r["_y"]), _keys=_keys(r), **_variant_parts(r), _attention=operator_of(r) == "attention")
           for r in out if r["_y"] is not None]
    if not out:
        why = " (peak memory is not measured on CPU)" if y == "mem" else ""
        raise ValueError(f"no record has a value for --y {y}{why}")
    return out


OTHER_OPERATORS_X = {"num_seqs": "sequences (batch)"}
"""Axis labels where a figure of another operator's cases means something else: a recurrence's batch."""


def x_label(x: str, attention: bool = True) -> str:
    """The label of axis ``x`` in a figure of attention's cases, or (``attention`` False) of another operator's."""
    return X_AXES[x][1] if attention else OTHER_OPERATORS_X.get(x, X_AXES[x][1])


def operator_of(row: dict) -> str:
    """The operator of a store row's case (its stored spec names it; attention's does not)."""
    spec = row.get("spec")
    spec = json.loads(spec) if isinstance(spec, str) else spec
    return spec.get("operator", "attention") if isinstance(spec, dict) else "attention"


def _variant_parts(row: dict) -> dict:
    """``_window`` and ``_variant`` of a row (a store row's spec, or an export row's columns) as line names:
    cases with another window or other features (``attnbench.features``) are another line."""
    spec = row.get("spec")
    spec = json.loads(spec) if isinstance(spec, str) else (spec or row)
    window = spec.get("window")
    if isinstance(window, str):
        window = json.loads(window)
    spec = {f.name: json.loads(v) if f.json_column and isinstance(v := spec.get(f.name), str) else spec.get(f.name)
            for f in features.FEATURES}  # an export row holds a list as JSON text
    parts = features.label_parts(spec)
    no_window = window is None or tuple(window) == (-1, -1)
    return {"_window": "no window" if no_window else f"window {window[0]},{window[1]}",
            "_variant": " ".join(parts) or "no variant"}


def _keys(row: dict) -> str:
    """Whether the case's keys are as long as its queries: cases with other keys are another line."""
    keys = row.get("seq_len_k")
    return "keys=queries" if keys is None or keys == row.get("seq_len") else "keys≠queries"


def _spread(row: dict, y: str, value: float) -> dict:
    """``_lo``, ``_hi``: the 95% CI of the median (info["median_ci95_ms"]) in the units of ``y``, where known."""
    ci, median = _info(row).get("median_ci95_ms"), row.get("median_ms")
    if not ci or not median or y == "mem" or not all(c and c > 0 for c in ci):
        return {}
    if y == "ms":
        return {"_lo": ci[0], "_hi": ci[1]}
    return {"_lo": value * median / ci[1], "_hi": value * median / ci[0]}  # rates: the inverse of the time


def _series_columns(pts: list[dict], x: str) -> list[str]:
    """Columns that split one backend's points into several lines, fewest needed.

    A column that may change along x (``ALONG_X``: e.g. head size when x is heads at a fixed embedding
    dim) splits lines only where it takes several values at one x; any other column splits them as soon
    as it varies. A column is kept only when it separates points the columns kept before it do not (so
    heads_kv is not named when it always equals heads_q)."""
    along = ALONG_X[x] | {X_AXES[x][0], "run_id"}
    if x != "seq_len":  # key lengths against queries matter only along the query length
        along.add("_keys")
    kept: list[str] = []

    def groups(cols: list[str], at_x: bool) -> int:
        return len({(p["backend"], p["_mark"], p["pass"], p["causal"], p["_x"] if at_x else None,
                     *(str(p.get(c)) for c in cols)) for p in pts})

    for col in SERIES_COLUMNS:
        if col == X_AXES[x][0]:
            continue
        at_x = col in along
        if groups([*kept, col], at_x) > groups(kept, at_x):
            kept.append(col)
    return kept


def series_label(p: dict, extra: list[str]) -> str:
    partners = {SPLIT_TOGETHER[c] for c in extra if c in SPLIT_TOGETHER}
    parts = [p["backend"]] + [SERIES_COLUMNS[c].format(p.get(c), **p) for c in extra if c not in partners]
    return " ".join(parts) + p.get("_mark", "")


def bands(pts: list[dict], x: str) -> dict[tuple[int, str], dict[str, list[tuple[float, float, float]]]]:
    """Like ``panels``: the CI of each point as (x, low, high), for the series whose points all have one."""
    extra = _series_columns(pts, x)
    out: dict = defaultdict(lambda: defaultdict(list))
    for p in pts:
        out[(int(p["causal"]), p["pass"])][series_label(p, extra)].append((p["_x"], p.get("_lo"), p.get("_hi")))
    return {k: {label: sorted(v) for label, v in series.items() if all(lo is not None for _, lo, _ in v)}
            for k, series in out.items()}


def busy_points(pts: list[dict], x: str) -> dict[tuple[int, str], list[tuple[str, float, float]]]:
    """Like ``panels``: the points timed on a busy CPU, as (series label, x, y)."""
    extra = _series_columns(pts, x)
    out: dict = defaultdict(list)
    for p in pts:
        if p.get("_busy"):
            out[(int(p["causal"]), p["pass"])].append((series_label(p, extra), p["_x"], p["_y"]))
    return dict(out)


def panels(pts: list[dict], x: str) -> dict[tuple[int, str], dict[str, list[tuple[float, float]]]]:
    """(causal, pass) -> series label -> sorted (x, y) points."""
    extra = _series_columns(pts, x)
    out: dict = defaultdict(lambda: defaultdict(list))
    for p in pts:
        out[(int(p["causal"]), p["pass"])][series_label(p, extra)].append((p["_x"], p["_y"]))
    return {k: {label: sorted(v) for label, v in series.items()} for k, series in out.items()}


def _tick_label(value: float) -> str:
    if float(value).is_integer():
        v = int(value)
        return f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v)
    return f"{value:g}"


def _style_x(ax, x: str, xs: list[float]) -> None:
    from matplotlib.ticker import NullLocator
    values = sorted(set(xs))
    integer = all(float(v).is_integer() for v in values)
    geometric = integer and values[0] > 0 and values[-1] >= 8 * values[0]
    if x in LOG2_X or geometric:
        ax.set_xscale("log", base=2)
    if integer and len(values) <= 12:
        ax.set_xticks(values)
        ax.set_xticklabels([_tick_label(v) for v in values])
        ax.xaxis.set_minor_locator(NullLocator())  # x only: a log y axis may need its minor ticks


MAX_LINES = 9
"""Most lines in one panel; more are split evenly over further figures."""


def plot_axes(rows: list[dict]) -> list[str]:
    """The x axes worth drawing: those taking several values among timed records, and not the same values
    as an axis already kept (key lengths equal to query lengths would repeat the sequence-length figure)."""
    ok = [r for r in rows if r.get("status") in DRAWN_STATUSES]
    out, seen = [], []
    # STA masks vary at one sequence length: drawn against the kept fraction, not against the sizes
    masks_vary = len({x_value(r, "kept") for r in ok} - {None}) > 1
    serving = any(is_serving(r) for r in ok)
    for x in X_AXES:
        if x in (SIZE_X if serving else SERVING_X):  # serving batches against their tokens, others their sizes
            continue
        values = [x_value(r, x) for r in ok]
        if len(set(values) - {None}) <= 1 or values in seen or (masks_vary and x not in ("kept", "sparsity")):
            continue
        out.append(x)
        seen.append(values)
    return out


def one_value(rows: list[dict], x: str) -> str | None:
    """Why ``x`` is no axis to draw against when every timed record has the same value on it (each line would
    be a single point), naming the axes the records do vary; None when it takes several values."""
    values = {x_value(r, x) for r in rows if r.get("status") in DRAWN_STATUSES} - {None}
    if len(values) != 1:
        return None
    others = ", ".join(plot_axes(rows)) or "none"
    return f"--x {x} takes one value here ({_tick_label(next(iter(values)))}): no line to draw; axes that vary: {others}"


def why_no_plot(rows: list[dict]) -> str:
    ok = [r for r in rows if r.get("status") in DRAWN_STATUSES]
    if not ok:
        return "No timed case to draw."
    fixed = [f"{X_AXES[x][1]} {_tick_label(next(iter(v)))}" for x in X_AXES
             if len(v := {x_value(r, x) for r in ok} - {None}) == 1]
    return ("No figure of an axis that does not vary: " + ", ".join(fixed) + " are fixed in this run"
            if fixed else "Nothing varies enough to draw.")


def backend_sets(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The backends split into figures a reader can tell apart: exact kernels, approximate ones (labelled
    so), and the API forms of a kernel (``fa2-varlen`` beside ``fa2``) apart from the kernels; sets of more
    than MAX_LINES backends are cut into several figures."""
    from attnbench.report.summary import api_kernel
    names = list(dict.fromkeys(r["backend"] for r in rows))
    approx = {r["backend"] for r in rows
              if r.get("status") == "ok" and not exact_of(r["status"], r.get("accuracy"), r.get("info"))}
    present = set(names)
    forms = [b for b in names if api_kernel(b, present) != b]
    sets = [("exact kernels", [b for b in names if b not in approx and b not in forms]),
            ("approximate kernels (dense-equivalent rates)", [b for b in names if b in approx and b not in forms]),
            ("API forms of one kernel", sorted(forms + list({api_kernel(b, present) for b in forms}),
                                               key=names.index))]
    out = []
    for title, members in sets:
        n = -(-len(members) // MAX_LINES)
        size = -(-len(members) // n) if members else 1
        chunks = [members[i:i + size] for i in range(0, len(members), size)]
        for i, chunk in enumerate(chunks):
            name = title if len(chunks) == 1 else f"{title} ({i + 1} of {len(chunks)})"
            subset = [dict(r, backend=r["backend"] + (" ≈" if r["backend"] in approx else "")) for r in rows
                      if r["backend"] in chunk]
            if subset:
                out.append((name, subset))
    return out


MIN_WIDTH = 10.0
"""Inches of the narrowest figure: a report shows it the width of the page."""
BAND_ALPHA = 0.18
SPREAD_NOTE = "shaded: 95% CI of the median"


def figure(rows: list[dict], x: str, y: str, *, title: str | None = None, logy: bool | None = None,
           unit: metrics.RateUnit | None = None):
    """A matplotlib Figure (Agg canvas) of ``y`` against ``x``; ValueError when nothing can be drawn.
    ``logy`` None: a log axis for times, which span decades over a sweep (fast kernels would sit on zero).
    Each point's 95% CI of the median is a band around its line, where the records hold one. ``unit``: of a
    rate (default: ``rate_unit`` of the rows; a report passes its run's, for all its figures)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if logy is None:
        logy = y == "ms"
    unit = unit or rate_unit(rows)
    pts = points(rows, x, y, unit)
    data, spread, busy = panels(pts, x), bands(pts, x), busy_points(pts, x)
    causals = sorted({c for c, _ in data})
    attention = any(p["_attention"] for p in pts)
    passes = [p for p in PASS_ORDER if any(k[1] == p for k in data)] + \
        sorted({p for _, p in data} - set(PASS_ORDER))
    labels = sorted({label for series in data.values() for label in series})
    style = styles.styles(labels)
    width = max(4.4 * len(passes) + 1.0, MIN_WIDTH)
    label_inches = max(LEGEND_COLUMN_INCHES, 0.7 + 0.085 * max(len(label) for label in labels))
    columns = max(1, min(LEGEND_COLUMNS, int(width // label_inches)))
    shaded = any(spread.values())
    note = "; ".join([SPREAD_NOTE] * shaded + [BUSY_NOTE] * bool(busy))
    legend_rows = -(-len(labels) // columns) + bool(note)  # and a line saying what the shading and ? are
    title = "\n".join(textwrap.fill(line, int(width * 13)) for line in
                      (title or f"{y_label(y, unit)} vs {x_label(x, attention)}").splitlines())
    title_lines = title.count("\n") + 1
    height = 3.3 * len(causals) + 0.8 + 0.22 * legend_rows + 0.2 * (title_lines - 1)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Fixed margins in inches (a layout engine costs a second full draw of every figure).
    fig.subplots_adjust(left=1.0 / width, right=1 - 0.25 / width, top=1 - (0.6 + 0.2 * (title_lines - 1)) / height,
                        bottom=(0.55 + 0.22 * legend_rows) / height, wspace=0.2, hspace=0.3)
    axes = fig.subplots(len(causals), len(passes), squeeze=False, sharex=True)
    for i, causal in enumerate(causals):
        for j, pass_ in enumerate(passes):
            ax = axes[i][j]
            _draw_panel(ax, data.get((causal, pass_), {}), spread.get((causal, pass_), {}), style, x, logy)
            for label, a, b in busy.get((causal, pass_), []):
                ax.annotate(BUSY_MARK, (a, b), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8, color=style[label]["color"])
            # causal or not is attention's axis; another operator's panels are named by the pass alone
            ax.set_title(f"{pass_} · {'causal' if causal else 'not causal'}" if attention else pass_, fontsize=10)
            if i == len(causals) - 1:
                ax.set_xlabel(x_label(x, attention))
            if j == 0:
                ax.set_ylabel(y_label(y, unit))
    handles = {label: line for ax in axes.flat for line, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), columns),
               fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.01 + bool(note) * 0.22 / height),
               columnspacing=LEGEND_SPACING)
    if note:
        fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, color="#555555")
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / height, va="top")
    return fig


def _draw_panel(ax, series: dict, spread: dict, style: dict, x: str, logy: bool) -> None:
    """One (causal, pass) panel: a line per series, its CI as a band, readable ticks."""
    if not series:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        return
    values = []
    for label, xy in sorted(series.items()):
        ax.plot([a for a, _ in xy], [b for _, b in xy], ms=4, label=label, **style[label])
        values += [b for _, b in xy]
        if label in spread:
            band = spread[label]
            ax.fill_between([a for a, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                            color=style[label]["color"], alpha=BAND_ALPHA, linewidth=0)
    ax.grid(True, which="major", alpha=0.3)
    if logy:
        ax.set_yscale("log")
        positive = [v for v in values if v > 0]
        if positive:
            styles.log_ticks(ax, min(positive), max(positive))
    else:  # tiny (CPU) or huge values: 1.2e-4 style with the power on top, not 0.000120
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))
    _style_x(ax, x, [a for xy in series.values() for a, _ in xy])


SVG_RC = {"svg.fonttype": "none", "font.sans-serif": ["DejaVu Sans", "Verdana", "Arial"]}
"""Rendered SVG keeps its text as text (the browser draws it, as sharp as the page's own), not as a path per
glyph, with a short list of fonts of DejaVu Sans's widths: a third of each figure's bytes."""


def render(rows: list[dict], x: str, y: str, fmt: str = "png", dpi: int = 110, **kwargs) -> bytes:
    """The figure as PNG or SVG bytes (SVG: text as text, written compactly, ``compact_svg``)."""
    import matplotlib

    with matplotlib.rc_context(SVG_RC if fmt == "svg" else {}):
        fig = figure(rows, x, y, **kwargs)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else None)
    return compact_svg(buf.getvalue().decode()).encode() if fmt == "svg" else buf.getvalue()


_NUMBER = re.compile(r"-?\d+\.\d+")
_GEOMETRY = re.compile(r'\s(d|x|y)="([^"]*)"')


def _tenth(number: re.Match) -> str:
    return f"{float(number[0]):.1f}".removesuffix(".0")


def compact_svg(svg: str) -> str:
    """matplotlib's SVG with the same picture in fewer bytes: coordinates to a tenth of a point (a figure 720 pt
    wide shown 1400 px wide: a fifth of a pixel), no metadata, no names on groups, no line breaks, styles
    without spaces and font names unquoted (valid CSS; a data URI then needs no quotes escaped)."""
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'<g id="[^"]*">', "<g>", svg)
    svg = _GEOMETRY.sub(lambda m: f' {m[1]}="{_NUMBER.sub(_tenth, m[2])}"', svg)
    svg = re.sub(r'style="([^"]*)"', lambda m: 'style="' + re.sub(r"([:;]) ", r"\1", m[1]).replace("'", "")
                 + '"', svg)
    return re.sub(r"\s*\n\s*", " ", svg)


def output_paths(out: Path) -> list[Path]:
    """FILE.png or FILE.svg -> that file; any other name -> NAME.png and NAME.svg."""
    if out.suffix.lower() in (".png", ".svg"):
        return [out]
    return [out.with_name(out.name + ".png"), out.with_name(out.name + ".svg")]


def save(rows: list[dict], x: str, y: str, out: Path, **kwargs) -> list[Path]:
    """Draw once and write every file ``output_paths(out)`` names; returns the paths written."""
    from attnbench.results import files
    paths = output_paths(out)
    fig = figure(rows, x, y, **kwargs)
    for path in paths:
        files.write_atomic(path, lambda tmp, path=path: fig.savefig(tmp, dpi=110, format=path.suffix[1:].lower()))
        log.info("wrote %s", path)
    return paths

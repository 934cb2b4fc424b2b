"""Charts from store rows: one line per backend, one panel per (causal, pass), units on the axes.

Works on record rows as ``ResultStore.rows`` returns them (flat columns, JSON text in ``info``).
Figures are drawn on matplotlib's Agg canvas without pyplot, so nothing global changes and no
display is needed.
"""

from __future__ import annotations

import io
import json
import logging
import textwrap
from collections import defaultdict
from pathlib import Path

from attnbench.results.record import exact_of, verdict_of

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
}
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
LOG2_X = ("seq_len", "kv_seq_len", "num_seqs")
"""Always on a log2 axis; other integer axes are log2 when they span 8x or more."""
PASS_ORDER = ("fwd", "bwd", "fwd_bwd")
LEGEND_COLUMNS = 4
LEGEND_COLUMN_INCHES = 2.2
"""Width one legend column needs (a 20-character label): narrower figures get fewer columns."""
# Columns that, when they vary beyond the x axis, split a backend's points into several lines.
# Columns that may change along each x axis without making a new line (see _series_columns).
ALONG_X: dict[str, set[str]] = {
    "seq_len": {"seq_len_k", "num_seqs"}, "kv_seq_len": {"seq_len", "num_seqs"},
    "num_seqs": {"seq_len", "seq_len_k"},
    "head_size": {"head_dim_v", "emb_dim"}, "emb_dim": {"head_dim", "head_dim_v", "heads_q", "heads_kv"},
    "heads": {"heads_kv", "head_dim", "head_dim_v", "emb_dim"}, "sparsity": set(), "kept": set(),
}
# In order of preference when naming lines.
SERIES_COLUMNS = {"run_id": "run {}", "num_seqs": "n{}", "seq_len": "s{}", "batch": "b{}", "heads_q": "h{}",
                  "head_dim": "d{}", "dtype": "{}", "heads_kv": "kv{}", "head_dim_v": "dv{}", "emb_dim": "e{}",
                  "seq_len_k": "sk{}", "window": "win{}", "timing_mode": "{}", "flops_convention": "{}"}


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


def x_value(row: dict, x: str) -> float | None:
    column = X_AXES[x][0]
    if column is not None:
        return row.get(column)
    if x == "sparsity":
        return sparsity(row)
    value = _info(row).get(COMPUTED_X[x])
    return None if value is None else float(value)


def y_value(row: dict, y: str) -> float | None:
    column, _, scale = Y_AXES[y]
    value = row.get(column)
    return None if value is None else value * scale


def check_axes(x: str, y: str) -> None:
    if x not in X_AXES:
        raise ValueError(f"unknown --x {x!r}; allowed: {', '.join(X_AXES)}")
    if y not in Y_AXES:
        raise ValueError(f"unknown --y {y!r}; allowed: {', '.join(Y_AXES)}")


DRAWN_STATUSES = ("ok", "mismatch")
"""Records with a time to draw: a mismatch keeps its time and is drawn marked as failed, never dropped."""
VERDICT_MARKS = {"fail": " [failed check]", "approx-fail": " [failed check]", "unchecked": " [unchecked]"}
"""Suffix that gives failed and unchecked points lines of their own, never mixed with checked ones."""


def points(rows: list[dict], x: str, y: str) -> list[dict]:
    """Rows that can be drawn (a time, x and y known), each with ``_x``, ``_y`` and ``_mark`` added.

    Raises ValueError saying why when nothing can be drawn."""
    check_axes(x, y)
    ok = [dict(r, _mark=VERDICT_MARKS.get(verdict_of(r["status"], r.get("accuracy")), ""))
          for r in rows if r.get("status") in DRAWN_STATUSES]
    if not ok:
        raise ValueError("no timed (status ok or mismatch) records to plot")
    with_x = [dict(r, _x=x_value(r, x)) for r in ok]
    with_x = [r for r in with_x if r["_x"] is not None]
    if not with_x:
        why = {"sparsity": " (only sparse backends record one)",
               "kept": " (only sliding-tile-mask (STA) cases record one)"}.get(x, "")
        raise ValueError(f"no record has a value for --x {x}{why}")
    out = [dict(r, _y=y_value(r, y)) for r in with_x]
    out = [r for r in out if r["_y"] is not None]
    if not out:
        why = " (peak memory is not measured on CPU)" if y == "mem" else ""
        raise ValueError(f"no record has a value for --y {y}{why}")
    return out


def _series_columns(pts: list[dict], x: str) -> list[str]:
    """Columns that split one backend's points into several lines, fewest needed.

    A column that may change along x (``ALONG_X``: e.g. head size when x is heads at a fixed embedding
    dim) splits lines only where it takes several values at one x; any other column splits them as soon
    as it varies. A column is kept only when it separates points the columns kept before it do not (so
    heads_kv is not named when it always equals heads_q)."""
    along = ALONG_X[x] | {X_AXES[x][0], "run_id"}
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
    parts = [p["backend"]] + [SERIES_COLUMNS[c].format(p.get(c)) for c in extra]
    return " ".join(parts) + p.get("_mark", "")


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


FAMILY_COLOURS = {"naive": "#7f7f7f", "sdpa": "#1f77b4", "flex": "#9467bd", "fa2": "#ff7f0e", "fa3": "#d62728",
                  "fa4": "#8c564b", "xformers": "#17becf", "flashinfer": "#2ca02c", "sage": "#bcbd22",
                  "sage2": "#e377c2", "sparge": "#6b6ecf", "cp": "#393b79", "sta": "#637939"}
"""One colour per backend family (the name up to its first '-'), the same in every figure."""
OTHER_COLOURS = ("#8c6d31", "#843c39", "#637939", "#7b4173", "#3182bd", "#e6550d")
MAX_LINES = 9
"""Most lines in one panel; more are split evenly over further figures."""


def family(backend: str) -> str:
    return backend.split("-", 1)[0]


def _colour(fam: str) -> str:
    if fam in FAMILY_COLOURS:
        return FAMILY_COLOURS[fam]
    return OTHER_COLOURS[sum(map(ord, fam)) % len(OTHER_COLOURS)]


def _styles(labels: list[str]) -> dict[str, dict]:
    """Colour per backend family; line style and marker per member of the family and per variant of a
    line (another batch, dtype, ...), so every line of a figure looks different."""
    backends = list(dict.fromkeys(label.split(" ", 1)[0] for label in labels))
    members: dict[str, list[str]] = {}
    for b in backends:
        members.setdefault(family(b), []).append(b)
    variants = list(dict.fromkeys(label.partition(" ")[2] for label in labels))
    markers, dashes = "osD^v<>ph*", ("-", "--", ":", "-.")
    out = {}
    for label in labels:
        b = label.split(" ", 1)[0]
        k = members[family(b)].index(b)
        v = variants.index(label.partition(" ")[2])
        approx = "≈" in label
        out[label] = {"color": _colour(family(b)), "marker": markers[(k + v) % len(markers)],
                      "linestyle": ":" if approx else dashes[(k + v) % len(dashes)],
                      "markerfacecolor": "white" if approx else None}
    return out


def plot_axes(rows: list[dict]) -> list[str]:
    """The x axes worth drawing: those taking several values among timed records, and not the same values
    as an axis already kept (key lengths equal to query lengths would repeat the sequence-length figure)."""
    ok = [r for r in rows if r.get("status") in DRAWN_STATUSES]
    out, seen = [], []
    # STA masks vary at one sequence length: drawn against the kept fraction, not against the sizes
    masks_vary = len({x_value(r, "kept") for r in ok} - {None}) > 1
    for x in X_AXES:
        values = [x_value(r, x) for r in ok]
        if len(set(values) - {None}) <= 1 or values in seen or (masks_vary and x not in ("kept", "sparsity")):
            continue
        out.append(x)
        seen.append(values)
    return out


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


def figure(rows: list[dict], x: str, y: str, *, title: str | None = None, logy: bool | None = None):
    """A matplotlib Figure (Agg canvas) of ``y`` against ``x``; ValueError when nothing can be drawn.
    ``logy`` None: a log axis for times, which span decades over a sweep (fast kernels would sit on zero)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatterSciNotation

    if logy is None:
        logy = y == "ms"
    pts = points(rows, x, y)
    data = panels(pts, x)
    causals = sorted({c for c, _ in data})
    passes = [p for p in PASS_ORDER if any(k[1] == p for k in data)] + \
        sorted({p for _, p in data} - set(PASS_ORDER))
    labels = sorted({label for series in data.values() for label in series})
    style = _styles(labels)
    width = max(4.4 * len(passes) + 1.0, 7.5)
    label_inches = max(LEGEND_COLUMN_INCHES, 0.4 + 0.075 * max(len(label) for label in labels))
    columns = max(1, min(LEGEND_COLUMNS, int(width // label_inches)))
    legend_rows = -(-len(labels) // columns)
    title = "\n".join(textwrap.fill(line, int(width * 13)) for line in
                      (title or f"{Y_AXES[y][1]} vs {X_AXES[x][1]}").splitlines())
    title_lines = title.count("\n") + 1
    height = 3.3 * len(causals) + 0.8 + 0.22 * legend_rows + 0.2 * (title_lines - 1)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Fixed margins in inches (a layout engine costs a second full draw of every figure).
    fig.subplots_adjust(left=1.0 / width, right=1 - 0.25 / width, top=1 - (0.6 + 0.2 * (title_lines - 1)) / height,
                        bottom=(0.55 + 0.22 * legend_rows) / height, wspace=0.28, hspace=0.3)
    axes = fig.subplots(len(causals), len(passes), squeeze=False, sharex=True)
    for i, causal in enumerate(causals):
        for j, pass_ in enumerate(passes):
            ax = axes[i][j]
            series = data.get((causal, pass_), {})
            for label, xy in sorted(series.items()):
                ax.plot([a for a, _ in xy], [b for _, b in xy], ms=4, label=label, **style[label])
            ax.set_title(f"{pass_} · {'causal' if causal else 'not causal'}", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
            if logy:
                ax.set_yscale("log")
                # Within one decade a log axis has no major tick: label the minor ones instead.
                ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            else:  # tiny (CPU) or huge values: 1.2e-4 style with the power on top, not 0.000120
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))
            if i == len(causals) - 1:
                ax.set_xlabel(X_AXES[x][1])
            if j == 0:
                ax.set_ylabel(Y_AXES[y][1])
            if series:
                _style_x(ax, x, [a for xy in series.values() for a, _ in xy])
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    handles = {label: line for ax in axes.flat for line, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), columns),
               fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.01))
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / height, va="top")
    return fig


def render(rows: list[dict], x: str, y: str, fmt: str = "png", dpi: int = 110, **kwargs) -> bytes:
    """The figure as PNG or SVG bytes."""
    fig = figure(rows, x, y, **kwargs)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return buf.getvalue()


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

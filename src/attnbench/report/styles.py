"""How figures tell lines apart, the same in every figure and report: a colour per backend, a marker per
family, a line style per variant of a line (another run, batch, dtype ...), hollow markers for approximate
kernels; and log axes ticked at 1, 2, 5, 10 with plain numbers.

Colours are fixed per built-in backend so that the backends drawn together (the exact kernels of a sweep, the
approximate ones, the API forms of one kernel, the variable-length kernels of a grouped-sequence sweep) never
share one; the palette cannot keep every backend apart everywhere, so where two share a colour their family's
marker tells them apart. Other backends (plug-ins, context-parallel methods) get a colour from a hash of their
name: stable, not guaranteed distinct.
"""

from __future__ import annotations

import hashlib
import math

PALETTE = {"blue": "#1f77b4", "orange": "#ff7f0e", "green": "#2ca02c", "red": "#d62728", "purple": "#9467bd",
           "brown": "#8c564b", "pink": "#e377c2", "grey": "#7f7f7f", "olive": "#bcbd22", "cyan": "#17becf",
           "navy": "#393b79", "gold": "#e6ab02", "moss": "#637939", "maroon": "#843c39", "plum": "#7b4173",
           "black": "#000000", "teal": "#1b9e77"}
COLOURS = {
    # exact kernels of a sweep: all distinct
    "naive": "grey", "naive-scale-scores": "black", "sdpa-math": "blue", "sdpa-flash": "orange",
    "sdpa-efficient": "green", "sdpa-cudnn": "red", "sdpa-varlen": "purple", "flex": "cyan", "fa2": "brown",
    "fa3": "pink", "fa4": "olive", "xformers": "navy", "flashinfer": "moss", "sta": "maroon", "sta-triton": "gold",
    # API forms, beside fa2, fa3, fa4 and sage; the variable-length ones (a grouped-sequence sweep's lines, with
    # flex and the references) also apart from each other and from sdpa-varlen and flex
    "fa2-qkvpacked": "blue", "fa2-kvpacked": "green", "fa2-varlen": "teal", "fa2-varlen-qkvpacked": "black",
    "fa3-varlen": "orange", "fa4-varlen": "red", "sage-varlen": "plum",
    # approximate kernels: all distinct
    "sage": "gold", "sage2-fp8": "blue", "sage2-fp8-sm90": "red", "sage2-fp16": "green", "sparge": "orange",
    "sparge-cdf": "purple", "sparge-fp16": "brown", "sparge-fp16-cdf": "cyan", "flex-sparse": "teal",
    # decode and paged caches, beside the dense kernels they are compared with
    "fa2-kvcache": "navy", "fa2-paged": "gold", "fa3-kvcache": "maroon", "fa3-paged": "moss",
    "flashinfer-decode": "plum", "flashinfer-paged": "maroon",
}
MARKERS = {"naive": "o", "sdpa": "s", "flex": "D", "fa2": "^", "fa3": "v", "fa4": "<", "xformers": ">",
           "sage": "p", "sage2": "h", "sparge": "*", "flashinfer": "X", "sta": "P", "cp": "d"}
"""One marker per family (the name up to its first '-'): members of a family share it."""
OTHER_MARKERS = "o8Hd"
DASHES = ("-", "--", ":", "-.")
"""Line styles of the variants of a backend's line, in the order they come (the first is solid)."""


def family(backend: str) -> str:
    return backend.split("-", 1)[0]


def _hashed(name: str, n: int) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) % n


def colour(backend: str) -> str:
    """The backend's colour (hex), the same in every figure."""
    name = COLOURS.get(backend)
    if name is None:
        keys = list(PALETTE)
        name = keys[_hashed(backend, len(keys))]
    return PALETTE[name]


def marker(backend: str) -> str:
    return MARKERS.get(family(backend)) or OTHER_MARKERS[_hashed(family(backend), len(OTHER_MARKERS))]


def styles(labels: list[str]) -> dict[str, dict]:
    """matplotlib keyword arguments per line label (``backend [variant ...][ ≈]``): the backend's colour, its
    family's marker, a line style per variant (another run, batch, dtype ...), hollow markers for approximate
    kernels (labels holding ``≈``)."""
    variants = list(dict.fromkeys(label.partition(" ")[2].replace("≈", "").strip() for label in labels))
    out = {}
    for label in labels:
        backend = label.split(" ", 1)[0]
        v = variants.index(label.partition(" ")[2].replace("≈", "").strip())
        approx = "≈" in label
        out[label] = {"color": colour(backend), "marker": marker(backend), "linestyle": DASHES[v % len(DASHES)],
                      "markerfacecolor": "white" if approx else None}
    return out


def plain_number(value: float, _pos=None) -> str:
    """A tick label without powers of ten: 0.02, 0.5, 2, 50, 2000 (1e-05 only below 1e-4)."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-4:
        return f"{value:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{value:g}"


def log_ticks(ax, low: float, high: float) -> None:
    """Ticks of a log y axis at 1, 2, 5 x 10^k (every integer multiple when the values span less than a
    decade, powers of ten alone past four decades), labelled as plain numbers, never 2x10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    decades = math.log10(high / low) if low > 0 else 0.0
    subs = tuple(range(1, 10)) if decades < 1 else (1.0, 2.0, 5.0) if decades <= 4 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.yaxis.set_minor_formatter(NullFormatter())

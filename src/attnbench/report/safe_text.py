"""Text that came from a file or a store (a trace step's name, a backend, a reason, a command), made safe to
show: it is shown as the characters it holds, never obeyed.

- ``clean``: control characters out. A terminal escape sequence (``ESC [ 2 J`` clears the screen, ``ESC ] 8``
  makes a link) is dropped whole; any other control character (C0, DEL, C1) and the bidirectional overrides
  (which make a line read otherwise than it is stored) become ``?``. Newlines and tabs are kept.
- ``markup``: ``clean``, then rich's markup escaped, for text put in a string rich reads markup in (a table
  cell, ``[bold]{name}[/]``): ``[/bold]`` or ``[link=file:///...]`` in a name is shown, not interpreted.
- ``html``: ``clean``, then escaped for HTML (the report).
- ``SafeConsole``: the consoles attnbench prints with. Every string they render is cleaned, whatever printed
  it, and a string whose markup rich cannot read is shown as it is rather than ending the command.
- ``escaped_summary``: the run summary's names, escaped for rich (its render builds markup around them).
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import replace

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as _escape_markup

_SEQUENCE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"          # CSI: colours, cursor moves, clearing the screen
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"     # OSC: window titles, links (up to BEL or ST)
    r"|[PX^_][^\x1b]*(?:\x1b\\)?"          # DCS, SOS, PM, APC strings
    r"|[ -/]*[0-~]"                        # two-character sequences (ESC c resets the terminal)
    r")?"
    r"|\x9b[0-?]*[ -/]*[@-~]")             # CSI in its one-byte (C1) form
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text) -> str:
    """``text`` without terminal escape sequences, its other control characters shown as ``?``."""
    return _CONTROL.sub("?", _SEQUENCE.sub("", str(text)))


def markup(text) -> str:
    """``text`` to put in a string rich reads markup in: cleaned, its markup escaped."""
    return _escape_markup(clean(text))


def html(text, quote: bool = True) -> str:
    """``text`` for an HTML page: cleaned, escaped (``quote``: quotes too, for attribute values)."""
    return _html.escape(clean(text), quote)


class SafeConsole(Console):
    """A rich Console whose every rendered string is cleaned (``clean``): nothing a file or a store holds can
    move the cursor, clear the screen or retitle the terminal. Markup rich cannot read (a closing tag that
    closes nothing) is shown as text. Emoji codes (``:smile:``) are left as written unless asked for."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **kwargs):
        text = clean(text)
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})


def escaped_summary(summary):
    """A copy of ``summary`` (report.summary.Summary) whose row labels, group titles, column names and cell
    texts are escaped for rich (``markup``); its header and notes are printed without markup, as they are."""
    def pivot(p):
        return replace(p, columns=[markup(c) for c in p.columns],
                       approx_column=markup(p.approx_column) if p.approx_column else p.approx_column,
                       groups=[group(g) for g in p.groups])

    def group(g):
        return replace(g, title=tuple(markup(t) for t in g.title), rows=[markup(r) for r in g.rows],
                       cells={(markup(r), markup(c)): replace(cell, text=markup(cell.text))
                              for (r, c), cell in g.cells.items()})
    return replace(summary, pivots=[pivot(p) for p in summary.pivots])

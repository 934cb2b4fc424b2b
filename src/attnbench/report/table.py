"""Terminal tables (rich) of records."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from attnbench.results.record import Record

STATUS_STYLE = {"ok": "green", "unsupported": "dim", "oom": "yellow", "error": "red", "nan": "red",
                "mismatch": "red"}


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def records_table(records: list[Record], title: str | None = None) -> Table:
    """One row per record: backend, case, pass, median ms, it/s, TF/s, GB/s, peak MiB, accuracy, status."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for name, justify in (("backend", "left"), ("case", "left"), ("pass", "left"), ("ms", "right"),
                          ("it/s", "right"), ("TF/s", "right"), ("GB/s", "right"), ("peak MiB", "right"),
                          ("accuracy", "left"), ("status", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "status")
    for r in records:
        mem = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
        verdict = (r.accuracy or {}).get("verdict", "-")
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason or ''}".strip(": ")
        table.add_row(r.backend, r.spec.label(), r.spec.pass_, _num(r.median_ms, ".3f"), _num(r.iters_per_s, ".1f"),
                      _num(r.tflops, ".1f"), _num(r.gbps, ".0f"), _num(mem, ".0f") if mem is not None else "n/a",
                      verdict, f"[{STATUS_STYLE.get(r.status, 'white')}]{escape(status)}[/]")
    return table

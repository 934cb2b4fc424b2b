"""Terminal tables (rich) of records."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from attnbench.results.record import Record, clock_of, verdict_of

STATUS_STYLE = {"ok": "green", "unsupported": "dim", "oom": "yellow", "error": "red", "nan": "red",
                "mismatch": "red", "implausible": "red"}


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _rate(value) -> str:
    """TF/s and GB/s: one decimal, but three significant digits for the small rates of CPU runs."""
    if value is None:
        return "-"
    return format(value, ".1f") if abs(value) >= 10 else format(value, ".3g")


def percent_of_peak(record: Record, peaks: dict[str, float] | None) -> float | None:
    """TF/s of the record as % of the measured matmul peak of its dtype (None when unknown)."""
    peak = (peaks or {}).get(record.spec.dtype)
    return None if not peak or record.tflops is None else 100.0 * record.tflops / peak


def percent_of_bandwidth(record: Record, peaks: dict[str, float] | None) -> float | None:
    """GB/s of the record (minimal bytes, see metrics.bytes_moved) as % of the measured copy bandwidth."""
    copy = (peaks or {}).get("copy")
    return None if not copy or record.gbps is None else 100.0 * record.gbps / copy


def records_table(records: list[Record], title: str | None = None, peaks: dict[str, float] | None = None) -> Table:
    """One row per record: backend, case, pass, median ms, it/s, TF/s, [% peak], GB/s, [% BW], peak MiB,
    [SM MHz], accuracy, status.

    ``peaks`` maps a dtype (bf16, fp16) to the device's *measured* matmul TFLOP/s and "copy" to its measured
    copy GB/s (attnbench calibrate): the "% peak" and "% BW" columns appear only when they are known. The
    SM MHz column (GPU runs) is the clock at the end of the timed calls, "↓" where it fell by more than 10%.
    """
    table = Table(title=title, show_lines=False, header_style="bold")
    columns = [("backend", "left"), ("case", "left"), ("pass", "left"), ("ms", "right"), ("it/s", "right"),
               ("TF/s", "right"), ("GB/s", "right"), ("peak MiB", "right"), ("accuracy", "left"), ("status", "left")]
    with_peak = any(k in (peaks or {}) for k in ("bf16", "fp16"))
    with_bw = "copy" in (peaks or {})
    if with_peak:
        columns.insert(6, ("% peak", "right"))
    if with_bw:  # memory-bound cases (decode): how close to the device's measured copy bandwidth
        columns.insert([name for name, _ in columns].index("GB/s") + 1, ("% BW", "right"))
    clocks = [clock_of(r.info) for r in records]
    show_clock = any(mhz is not None for mhz, _ in clocks)
    if show_clock:  # GPU runs: the SM clock at the end of the timed calls, "↓" where it fell during them
        columns.insert(columns.index(("peak MiB", "right")) + 1, ("SM MHz", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name != "status")
    clock_at = [name for name, _ in columns].index("SM MHz") if show_clock else None
    for r, (mhz, dropped) in zip(records, clocks, strict=True):
        mem = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
        verdict = verdict_of(r.status, r.accuracy)
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason or ''}".strip(": ")
        cells = [r.backend, r.spec.label(), r.spec.pass_, _num(r.median_ms, ".3f"), _num(r.iters_per_s, ".1f"),
                 _rate(r.tflops), _rate(r.gbps), _num(mem, ".0f") if mem is not None else "n/a",
                 verdict, f"[{STATUS_STYLE.get(r.status, 'white')}]{escape(status)}[/]"]
        if with_peak:
            cells.insert(6, _num(percent_of_peak(r, peaks), ".0f"))
        if with_bw:
            cells.insert([name for name, _ in columns].index("% BW"), _num(percent_of_bandwidth(r, peaks), ".0f"))
        if show_clock:
            clock = "-" if mhz is None else f"{mhz}{'↓' if dropped else ''}"
            cells.insert(clock_at, f"[yellow]{clock}[/]" if dropped else clock)
        table.add_row(*cells)
    return table

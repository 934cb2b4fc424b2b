"""Terminal tables (rich) of records."""

from __future__ import annotations

from rich import box
from rich.table import Table

from attnbench.report.safe_text import markup as escape
from attnbench.results.record import Record, busy_of, clock_of, verdict_of

STATUS_STYLE = {"ok": "green", "unsupported": "dim", "oom": "yellow", "error": "red", "nan": "red",
                "mismatch": "red", "implausible": "red"}


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _rate(value) -> str:
    """TF/s and GB/s: one decimal, but three significant digits for the small rates of CPU runs."""
    if value is None:
        return "-"
    return format(value, ".1f") if abs(value) >= 10 else _sig(value, 3)


def _sig(value, digits: int = 4) -> str:
    """``digits`` significant digits, trailing zeros kept (1.400, 0.2635), whole numbers from 10**digits on."""
    if value is None:
        return "-"
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:#.{digits}g}".rstrip(".")


def percent_of_peak(record: Record, peaks: dict[str, float] | None) -> float | None:
    """TF/s of the record as % of the measured matmul peak of its dtype (None when unknown)."""
    peak = (peaks or {}).get(record.spec.dtype)
    return None if not peak or record.tflops is None else 100.0 * record.tflops / peak


def percent_of_bandwidth(record: Record, peaks: dict[str, float] | None) -> float | None:
    """GB/s of the record (minimal bytes, see metrics.bytes_moved) as % of the measured copy bandwidth."""
    copy = (peaks or {}).get("copy")
    return None if not copy or record.gbps is None else 100.0 * record.gbps / copy


def records_table(records: list[Record], title: str | None = None, peaks: dict[str, float] | None = None) -> Table:
    """One row per record: backend, case, pass, median ms, it/s, TF/s (GF/s when every rate is under 1 TF/s),
    [% peak], GB/s, [% BW], [peak MiB], [SM MHz], check, status; laid out to fold the case and the status so
    the table fits the console's width.

    ``peaks`` maps a dtype (bf16, fp16) to the device's *measured* matmul TFLOP/s and "copy" to its measured
    copy GB/s (attnbench calibrate): the "% peak" and "% BW" columns appear only when they are known. Peak
    memory appears when it was measured (not on CPU). The SM MHz column (GPU runs) is the clock at the end of
    the timed calls, "↓" where it fell by more than 10%.
    """
    from attnbench.report.summary import unit_of
    unit, scale = unit_of(records, "tflops")
    clocks = [clock_of(r.info) for r in records]
    columns: list[tuple[str, str, object]] = [
        ("backend", "left", lambda r, c: escape(r.backend)), ("case", "left", lambda r, c: escape(r.spec.label())),
        ("pass", "left", lambda r, c: escape(r.spec.pass_)), ("ms", "right", lambda r, c: _sig(r.median_ms)),
        ("it/s", "right", lambda r, c: _sig(r.iters_per_s)),
        (unit, "right", lambda r, c: _rate(None if r.tflops is None else r.tflops * scale))]
    if any(k in (peaks or {}) for k in ("bf16", "fp16")):
        columns.append(("% peak", "right", lambda r, c: _num(percent_of_peak(r, peaks), ".0f")))
    columns.append(("GB/s", "right", lambda r, c: _rate(r.gbps)))
    if "copy" in (peaks or {}):  # memory-bound cases (decode): how close to the device's measured copy bandwidth
        columns.append(("% BW", "right", lambda r, c: _num(percent_of_bandwidth(r, peaks), ".0f")))
    if any(r.peak_mem_bytes is not None for r in records):
        columns.append(("peak MiB", "right",
                        lambda r, c: "n/a" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**20:.0f}"))
    if any(mhz is not None for mhz, _ in clocks):  # GPU runs: the SM clock at the end of the timed calls
        columns.append(("SM MHz", "right", lambda r, c: "-" if c[0] is None else
                        (f"[yellow]{c[0]}↓[/]" if c[1] else str(c[0]))))
    columns += [("check", "left",
                 lambda r, c: escape(verdict_of(r.status, r.accuracy)) + ("?" if busy_of(r.info) else "")),
                ("status", "left", _status)]
    table = Table(title=escape(title) if title else title, title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify, _ in columns:
        table.add_column(name, justify=justify, no_wrap=name not in ("case", "status"), overflow="fold")
    for r, clock in zip(records, clocks, strict=True):
        table.add_row(*[cell(r, clock) for _, _, cell in columns])
    return table


def _status(r: Record, clock) -> str:
    text = r.status if r.status == "ok" else f"{r.status}: {r.reason or ''}".strip(": ")
    return f"[{STATUS_STYLE.get(r.status, 'white')}]{escape(text)}[/]"

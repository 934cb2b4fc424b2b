"""Terminal tables (rich) of records."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from attnbench.report.safe_text import markup as escape
from attnbench.results.record import Record, busy_of, clock_of, interval_of, verdict_of
from attnbench.serving import span
from attnbench.spec import LABEL_SEQUENCES, AttnSpec

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


def ci_pct(record: Record) -> str:
    """Half the width of the 95% interval of the median (``record.interval_of``) in % of the median, two
    significant digits at most: "0.31", "2.4", "12"; "-" where there is none."""
    ci = interval_of(record.info)
    if ci is None or not record.median_ms:
        return "-"
    half = 100 * (ci[1] - ci[0]) / 2 / record.median_ms
    return f"{half:.2f}" if half < 1 else f"{half:.1f}" if half < 10 else f"{half:.0f}"


def percent_of_peak(record: Record, peaks: dict[str, float] | None) -> float | None:
    """TF/s of the record as % of the measured matmul peak of its dtype (None when unknown)."""
    peak = (peaks or {}).get(record.spec.dtype)
    return None if not peak or record.tflops is None else 100.0 * record.tflops / peak


def percent_of_bandwidth(record: Record, peaks: dict[str, float] | None) -> float | None:
    """GB/s of the record (minimal bytes, see metrics.bytes_moved) as % of the measured copy bandwidth."""
    copy = (peaks or {}).get("copy")
    return None if not copy or record.gbps is None else 100.0 * record.gbps / copy


def records_table(records: list[Record], title: str | None = None, peaks: dict[str, float] | None = None,
                  width: int = 100) -> Table:
    """One row per record: backend, case, pass, median ms, it/s, TF/s (GF/s when every rate is under 1 TF/s),
    [% peak], GB/s, [% BW], [peak MiB], [SM MHz], check, status, with "±%" (half the 95% interval of the median,
    in % of it) instead of it/s where records have one; laid out for ``width`` columns: the case on
    at most two lines (``case_texts``; it/s gives way where they would not fit), the status folded into what is
    left.

    ``peaks`` maps a dtype (bf16, fp16) to the device's *measured* matmul TFLOP/s and "copy" to its measured
    copy GB/s (attnbench calibrate): the "% peak" and "% BW" columns appear only when they are known. Peak
    memory appears when it was measured (not on CPU). The SM MHz column (GPU runs) is the clock at the end of
    the timed calls, "↓" where it fell by more than 10%. A check timed on a busy CPU reads "pass ?".
    """
    from attnbench.report.summary import unit_of
    unit, scale = unit_of(records, "tflops")
    clocks = [clock_of(r.info) for r in records]
    columns: list[tuple[str, str, object]] = [
        ("backend", "left", lambda r, c: escape(r.backend)), ("case", "left", lambda r, c: ""),
        ("pass", "left", lambda r, c: escape(r.spec.pass_)), ("ms", "right", lambda r, c: _sig(r.median_ms)),
        # how well the run knows the time, where the records say; else it/s (1000 / ms, which says nothing new)
        ("±%", "right", lambda r, c: ci_pct(r)) if any(interval_of(r.info) for r in records) else
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
    columns += [("check", "left", lambda r, c: escape(verdict_of(r.status, r.accuracy)) + (f" {BUSY}" if busy_of(r.info) else "")),
                ("status", "left", _status)]
    rows = [[cell(r, clock) for _, _, cell in columns] for r, clock in zip(records, clocks, strict=True)]
    status = min(STATUS_MIN, max([len("status")] + [Text.from_markup(row[-1]).cell_len for row in rows]))
    moved: list[str] = []  # columns the same in every row, said once in the title instead
    while True:
        fixed = sum(max(len(name), *(Text.from_markup(row[i]).cell_len for row in rows))
                    for i, (name, _, _) in enumerate(columns) if name not in ("case", "status"))
        line = width - fixed - status - (3 * len(columns) - 1)  # a space either side of a cell, a rule between
        cases, shared = case_texts([r.spec for r in records], line)
        if all(len(x) <= line for c in cases for x in c.splitlines()):
            break
        names = [c[0] for c in columns]
        if "it/s" in names or "±%" in names:  # the first to give way to a case
            drop = names.index("it/s" if "it/s" in names else "±%")
        else:  # then a column with one value in every row (the pass, the clock), into the title
            same = [i for i, name in enumerate(names) if name in TITLE_COLUMNS
                    and len({Text.from_markup(row[i]).plain for row in rows}) == 1]
            if not same:
                break
            drop = same[0]
            moved.append(TITLE_COLUMNS[names[drop]].format(Text.from_markup(rows[0][drop]).plain))
        columns.pop(drop)
        rows = [row[:drop] + row[drop + 1:] for row in rows]
    title = "; ".join(filter(None, [title, f"every case: {shared}" if shared else "", *moved])) or None
    table = Table(title=escape(title) if title else title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    case_width = max((len(line) for text in cases for line in text.splitlines()), default=4)
    for name, justify, _ in columns:  # the case breaks where case_texts breaks it; the status folds
        table.add_column(name, justify=justify, no_wrap=name != "status", overflow="fold",
                         min_width={"case": case_width, "status": status}.get(name))
    for row, case in zip(rows, cases, strict=True):
        row[1] = escape(case)
        table.add_row(*row)
    return table


TITLE_COLUMNS = {"pass": "pass {}", "SM MHz": "SM clock {} MHz"}
"""Columns that, when a table is too narrow and they hold one value in every row, the title says once instead."""
BUSY = "?"
"""The mark of a result timed while other processes kept the CPU busy (as the summary's cells have it)."""
STATUS_MIN = 12
"""Columns the status folds into at least (an unsupported case's reason)."""
CASE_MIN = 24
"""Columns a case line has at least, however many columns the rest of the table takes."""
REQUESTS_SHOWN = 24
"""Characters of a serving batch's requests spelled out in a case; more (a trace's step) are summed up."""


def case_texts(specs: list[AttnSpec], line: int) -> tuple[list[str], str]:
    """Each case on at most two lines of ``line`` characters (at least ``CASE_MIN``), broken at the space that
    makes the lines most even, and the words every case shares that were taken out to make them fit in ``line``
    (for the title; the batch and the lengths always stay). A serving batch whose requests take more than
    ``REQUESTS_SHOWN`` characters to spell out is named by its count of requests and their ranges of new tokens
    and keys."""
    room, line = max(line, 1), max(CASE_MIN, line)
    parts = [_parts(spec) for spec in specs]
    shared: list[str] = []
    if any(len(" ".join(head + rest)) > 2 * room for head, rest in parts):
        shared = [word for word in parts[0][1] if all(word in rest for _, rest in parts)]
        parts = [(head, [word for word in rest if word not in shared]) for head, rest in parts]
    return [_two_lines(head + rest, line) for head, rest in parts], " ".join(shared)


def _parts(spec: AttnSpec) -> tuple[list[str], list[str]]:
    """The words of the case's label: (the batch and the lengths, the rest); a long serving batch's requests
    summed up."""
    words = spec.label().split(" ")
    head = words[:2]
    if len(getattr(spec, "seqlens_q", ())) > LABEL_SEQUENCES and len(words[1]) > REQUESTS_SHOWN + len("reqs[]"):
        head = [words[0], f"reqs[{len(spec.seqlens_q)}:", f"q{span(spec.seqlens_q)}", f"kv{span(spec.seqlens_k)}]"]
    return head, words[2:]


def _two_lines(words: list[str], line: int) -> str:
    text = " ".join(words)
    if len(text) <= line or len(words) < 2:
        return text
    cut = min(range(1, len(words)), key=lambda i: max(len(" ".join(words[:i])), len(" ".join(words[i:]))))
    return " ".join(words[:cut]) + "\n" + " ".join(words[cut:])


def _status(r: Record, clock) -> str:
    text = r.status if r.status == "ok" else f"{r.status}: {r.reason or ''}".strip(": ")
    return f"[{STATUS_STYLE.get(r.status, 'white')}]{escape(text)}[/]"

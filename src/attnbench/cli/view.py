"""`attnbench plot`, `report` and `export`: look at what is in the results store."""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.results import export as exportmod
from attnbench.results import files
from attnbench.results.record import STATUSES
from attnbench.results.store import DEFAULT_DB, ResultStore, check_run_id
from attnbench.spec import PASSES

Runs = Annotated[list[str] | None, typer.Option(
    "--run", metavar="RUN", help="Run id(s) or unique prefixes; 'latest' = the newest run of `attnbench run`, not a "
    "verify, e2e or dist (default: latest).")]
BackendFilter = Annotated[list[str] | None, typer.Option(
    "--backend", "--backends", metavar="NAME", help="Only these backends (comma separated or repeated).")]
PassFilter = Annotated[list[str] | None, typer.Option("--pass", metavar="PASS", help="Only these passes: fwd, bwd, fwd_bwd.")]


def open_store(db: Path | None) -> ResultStore:
    path = Path(db or DEFAULT_DB)
    if not path.is_file():
        raise UserError(f"no results database at {path}: run `attnbench run` first or give --db")
    return ResultStore(path, readonly=True)


PASSED_OVER = ("verify", "e2e", "dist")
"""Commands whose runs ``latest`` passes over: a verify calls each case once, to check it (no speed to show);
e2e and dist time whole models and distributed methods. ``latest`` is the newest sweep of ``attnbench run``."""


def run_command(run: dict) -> str | None:
    """The attnbench command that made a run (run, verify, e2e, dist), from the command line it stored."""
    words = (run.get("command") or "").split()
    return words[1] if len(words) > 1 and words[0] == "attnbench" else None


def latest_timed(runs: list[dict]) -> dict | None:
    """The newest run of ``attnbench run`` (or of an unknown command: a store's own); the newest run of any kind
    when there is none."""
    timed = [r for r in runs if run_command(r) not in PASSED_OVER]
    return (timed or runs or [None])[-1]


LINE_WIDTH = 100
"""Columns of the line that names the run ``latest`` chose: its command is cut to fit them."""


def latest_line(store: ResultStore, run_id: str) -> str:
    """Which run ``latest`` chose, in one line of at most LINE_WIDTH columns (its command cut to fit), and the
    newer runs it passed over, in a second line when there are any."""
    import datetime

    runs = store.runs()
    index = next(i for i, r in enumerate(runs) if r["run_id"] == run_id)
    run, newer = runs[index], runs[index + 1:]
    when = (datetime.datetime.fromtimestamp(run["created_at"]).strftime("%Y-%m-%d %H:%M")
            if run.get("created_at") else "?")
    if newer:
        why = "the newest sweep"  # of attnbench run: the next line names the newer runs of other commands
    elif run_command(run) in PASSED_OVER:
        why = f"the newest run, a {run_command(run)}: no run in this store is a sweep of attnbench run"
    else:
        why = "the newest run"
    head, tail = f"attnbench: run {run_id} ({when}", f"): {why}"
    room = LINE_WIDTH - len(head) - len(tail) - 2  # ", " before the command
    command = short_command(run.get("command") or "?")
    if len(command) > room:
        command = command[:room - 1] + "…" if room >= 12 else ""  # a stub of a command says nothing
    line = head + (f", {command}" if command else "") + tail
    if newer:
        kinds = collections.Counter(run_command(r) for r in newer)
        counted = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        line += f"\nattnbench: passed over newer runs, not sweeps: {counted} (--run {newer[-1]['run_id']})"
    return line


def resolve_run(store: ResultStore, text: str) -> str:
    """A run id from an exact id, a unique prefix, or 'latest' (the newest sweep of ``attnbench run``, not a
    verify: ``latest_timed``); UserError naming recent runs otherwise."""
    runs = [r["run_id"] for r in store.runs()]
    if text == "latest":
        if not runs:
            raise UserError(f"{store.path} holds no runs")
        return latest_timed(store.runs())["run_id"]
    if text in runs:
        return text
    matches = [r for r in runs if r.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    status = {r["run_id"]: r.get("status") for r in store.runs()}
    recent = ", ".join(f"{r} ({status[r]})" for r in reversed(runs[-5:])) or "none"  # the newest first
    if matches:
        raise UserError(f"run id {text!r} is ambiguous in {store.path}: {', '.join(matches[:5])}")
    raise UserError(f"no run {text!r} in {store.path}; most recent: {recent}")


def resolve_runs(store: ResultStore, runs: list[str] | None) -> list[str]:
    """The runs asked for (``latest`` when none is)."""
    items = _split(runs, "--run") or ["latest"]
    return list(dict.fromkeys(resolve_run(store, r) for r in items))


def file_stem(db: Path, run_ids: list[str]) -> str:
    """The part of a file's name that names ``run_ids`` (``report-ID.html``, a plot's ``ID-ms-vs-seq_len``). Each
    stored id must pass ``check_run_id``, which keeps it one plain name: an id written into the store by other
    means (``../../x``) would otherwise put the file outside its folder."""
    for run_id in run_ids:
        try:
            check_run_id(run_id, "stored run id")
        except ValueError as exc:
            raise UserError(f"{exc}; {db} holds it, and it cannot name a file: give the file's name with -o FILE"
                            ) from None
    return "+".join(run_ids)


def chosen_line(store: ResultStore, runs: list[str] | None) -> str | None:
    """``latest_line`` when ``runs`` asks for ``latest`` (or nothing); None when the runs were named. A view
    prints it on stderr once it has done its work (a refusal stays one line)."""
    if "latest" not in (_split(runs, "--run") or ["latest"]):
        return None
    return latest_line(store, resolve_run(store, "latest"))


def say(line: str | None) -> None:
    if line:
        common.err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def _split(values: list[str] | None, flag: str = "") -> list[str]:
    """Comma-separated or repeated values; an empty one (``--run ''``, ``a,,b``) is an error, not 'all'."""
    items = [p.strip() for v in values or [] for p in str(v).split(",")]
    if any(not item for item in items):
        raise UserError(f"bad {flag or 'filter'} {common.shown(','.join(map(str, values)))}: an empty name")
    return items


def select_rows(store: ResultStore, run_ids: list[str], backends: list[str] | None = None,
                passes: list[str] | None = None, statuses: list[str] | None = None) -> list[dict]:
    """Rows of ``run_ids`` filtered by backend, pass and status (unknown statuses are an error)."""
    backends, passes = _split(backends, "--backend"), _split(passes, "--pass")
    statuses = _split(statuses, "--status")
    bad = [s for s in statuses if s not in STATUSES]
    if bad:
        raise UserError(f"unknown --status {common.shown(', '.join(bad))}; allowed: {', '.join(STATUSES)}")
    bad = [p for p in passes if p not in PASSES]
    if bad:
        raise UserError(f"unknown --pass {common.shown(', '.join(bad))}; allowed: {', '.join(PASSES)}")
    rows = [r for run_id in run_ids for r in store.rows(run_id)]
    present = dict.fromkeys(r["backend"] for r in rows)
    missing = [b for b in backends if b not in present]
    if missing:  # a typo must not look like "no records"
        raise UserError(f"no backend {common.shown(', '.join(missing))} in run {', '.join(run_ids)}; "
                        f"its backends: {', '.join(present) or 'none'}")
    return [r for r in rows if (not backends or r["backend"] in backends) and (not passes or r["pass"] in passes)
            and (not statuses or r["status"] in statuses)]


def plot(
    x: Annotated[str, typer.Option("--x", help="seq_len, kv_seq_len, num_seqs, head_size, emb_dim, heads, sparsity, kept, or for serving "
                                   "batches new_tokens or kv_tokens.")],
    y: Annotated[list[str], typer.Option("--y", metavar="Y", help="ms, tflops, gbps or mem (repeatable: one figure each).")],
    run: Runs = None,
    db: common.Db = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="FILE.png or FILE.svg; any other name writes NAME.png and NAME.svg.")] = None,
    backend: BackendFilter = None,
    pass_: PassFilter = None,
    logy: Annotated[bool | None, typer.Option("--logy/--linear-y", help="Logarithmic or linear y axis (default: "
                                              "log for ms, linear for rates and memory).")] = None,
    title: Annotated[str | None, typer.Option("--title", help="Figure title.")] = None,
) -> None:
    """Draw one metric against one sweep axis: a line per backend, a panel per pass and causal setting."""
    from attnbench.report import plots

    ys = _split(y, "--y")
    try:
        for item in ys:
            plots.check_axes(x, item)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    with open_store(db) as store:
        run_ids = resolve_runs(store, run)
        rows = select_rows(store, run_ids, backend, pass_)
        folder = store.path.parent / "plots"
        chosen = chosen_line(store, run)
    if not rows:
        raise UserError(f"no records in run {', '.join(run_ids)} match the --backend/--pass filters")
    outs = {}
    for item in ys:
        if output is None:
            outs[item] = folder / f"{file_stem(store.path, run_ids)}-{item}-vs-{x}"
        else:
            outs[item] = output if len(ys) == 1 else output.with_name(f"{output.stem}-{item}{output.suffix}")
        for path in plots.output_paths(outs[item]):  # all refused before any is drawn
            files.check_output(path, "--output" if output is not None else "plot (no -o given)", stores=(store.path,))
    if (why := plots.one_value(rows, x)) is not None:
        raise UserError(f"cannot plot run {', '.join(run_ids)} against {x}: {why}")
    written = []
    for item, out in outs.items():
        try:
            written += plots.save(rows, x, item, out, logy=logy, title=title)
        except ValueError as exc:
            raise UserError(f"cannot plot {item} vs {x} for run {', '.join(run_ids)}: {exc}") from None
    for path in written:
        common.console.print(f"wrote {path}", highlight=False, markup=False)
    say(chosen)
    impossible = [r for r in rows if r["status"] == "implausible"]
    if impossible:
        shown = "; ".join(f"{r['backend']} {r['label']} {r['pass']}" for r in impossible[:3])
        common.console.print(f"not drawn: {len(impossible)} case(s) with an implausible time ({shown}"
                             f"{' ...' if len(impossible) > 3 else ''}; see `attnbench export`)", highlight=False,
                             markup=False)


def report(
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="HTML file to write (default: report-RUN.html beside the store).")] = None,
    run: Runs = None,
    db: common.Db = None,
) -> None:
    """Write one self-contained HTML report (environment, tables, plots, accuracy, skipped cases)."""
    from attnbench.report import html

    if output is not None:  # refused before the report is built
        files.check_output(output, "--output", stores=(Path(db or DEFAULT_DB),))
    with open_store(db) as store:
        run_ids = resolve_runs(store, run)
        if output is None:  # beside the store, as plots are, not into whatever folder the command ran in
            more = f"+{len(run_ids) - 1}" if len(run_ids) > 1 else ""
            name = f"report-{file_stem(store.path, run_ids[:1])}{more}.html"
            output = files.check_output(store.path.parent / name,
                                        "report (no -o given)", stores=(store.path,))
        text = html.build(store, run_ids)
        chosen = chosen_line(store, run)
    files.write_text_atomic(output, text)
    common.console.print(f"wrote {output} ({len(text) / 1024:.0f} KiB, runs: {', '.join(run_ids)})",
                         highlight=False, markup=False)
    say(chosen)


def export(
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", help="csv, json or parquet (default: from the -o file's suffix, else csv).")] = None,
    run: Runs = None,
    all_runs: Annotated[bool, typer.Option("--all-runs", help="Every run in the database.")] = False,
    backend: BackendFilter = None,
    status: Annotated[list[str] | None, typer.Option("--status", metavar="STATUS", help="Only these statuses (ok, error, ...).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    db: common.Db = None,
) -> None:
    """Write records of a run as CSV, JSON or Parquet (to a file, or to stdout for CSV and JSON)."""
    suffix = output.suffix.lower().lstrip(".") if output is not None else ""
    if fmt is None:
        fmt = suffix if suffix in exportmod.FORMATS else "csv"
    fmt = fmt.lower()
    if fmt not in exportmod.FORMATS:
        raise UserError(f"bad --format {common.shown(fmt)}; allowed: {', '.join(exportmod.FORMATS)}")
    if suffix in exportmod.FORMATS and suffix != fmt:
        raise UserError(f"--format {fmt} but -o {output.name} says {suffix}: drop one, or make them agree")
    if output is None and fmt == "parquet":
        raise UserError("--format parquet needs an output file: -o FILE.parquet")
    if all_runs and run:
        raise UserError("--all-runs exports every run; drop --run (or drop --all-runs)")
    if output is not None:
        files.check_output(output, "-o", stores=(Path(db or DEFAULT_DB),))
    with open_store(db) as store:
        run_ids = [r["run_id"] for r in store.runs()] if all_runs else resolve_runs(store, run)
        rows = select_rows(store, run_ids, backend, None, status)
        chosen = None if all_runs else chosen_line(store, run)
    try:
        if output is None:
            sys.stdout.write(exportmod.dumps(rows, fmt))
            say(chosen)
            return
        exportmod.write(rows, output, fmt)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    common.err_console.print(f"wrote {len(rows)} records to {output}", highlight=False, markup=False)
    say(chosen)


def planned_cases(run: dict, stored: int) -> int:
    """The cases ``run`` set out to run: its stored count (runs of this version of ``attnbench run``), else the
    ``stored`` records it holds."""
    return max(run.get("cases") or 0, stored)


def unfinished_line(store: ResultStore, run_ids: list[str]) -> str | None:
    """For runs of ``attnbench run`` that were stopped: how far each got and the command that completes it."""
    from attnbench.cli.control import resume_hint

    lines = []
    for run_id in run_ids:
        run = store.run(run_id) or {}
        if run.get("status") != "interrupted" or run_command(run) not in ("run", None):
            continue
        stored = len(store.case_ids(run_id))
        lines += [f"run {run_id} was stopped after {stored} of {planned_cases(run, stored)} cases; to complete it:",
                  "  " + resume_hint(run_id, store.path).removeprefix("resume with: ")]
    return "\n".join(lines) or None


def show(
    run: Runs = None,
    db: common.Db = None,
    backend: BackendFilter = None,
    table: Annotated[bool, typer.Option("--table", help="Every record, one row each, instead of the summary.")] = False,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="tflops, ms, gbps or speedup (default: tflops; speedup with --baseline).")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", metavar="NAME", help="Backend of the speedups.")] = None,
) -> None:
    """Print a stored run as `run` ends: which kernel is fastest at each shape (or every record with --table)."""
    from attnbench.cli.run import check_summary_options, show_summary
    from attnbench.report.table import records_table
    from attnbench.results.record import Record

    with open_store(db) as store:
        run_ids = resolve_runs(store, run)
        rows = select_rows(store, run_ids, backend)
        env = store.env(store.run(run_ids[0])["env_id"] or "") or {}
        chosen = chosen_line(store, run)
        planned = None if backend else sum(planned_cases(store.run(r), len(store.case_ids(r))) for r in run_ids)
        unfinished = unfinished_line(store, run_ids)
    if not rows:
        raise UserError(f"no records in run {', '.join(run_ids)} match the --backend filter")
    records = [Record.from_row(r) for r in rows]
    if table:
        common.console.print(records_table(records, title=f"run {', '.join(run_ids)}", width=common.console.width))
        say(chosen)
        return
    config = {"metric": metric, "baseline": baseline}
    check_summary_options(config, tuple(dict.fromkeys(r.backend for r in records)))
    show_summary(records, config, env.get("device_name") or "", planned=planned)
    if unfinished:
        common.console.print(unfinished, highlight=False, markup=False, soft_wrap=True)  # the command stays whole
    say(chosen)


DEVICE_WORDS = ("NVIDIA ", "(R)", "(TM)", " Processor", " CPU")
"""Words a device name in ``runs`` goes without (the vendor's marks; the CPU model stays)."""
DEVICE_WIDTH = 14
"""Columns of a device's name in ``runs`` (without --full): 'H100 80GB HBM3', 'AMD EPYC 7B13…'."""


def short_device(name: str) -> str:
    """A device's name as the ``runs`` table shows it: 'H100 80GB HBM3', 'AMD EPYC 7B13 64-Core'."""
    for word in DEVICE_WORDS:
        name = name.replace(word, "")
    return " ".join(name.split()) or "-"


def short_command(command: str) -> str:
    """A run's command without the ``attnbench`` every stored command starts with."""
    words = " ".join(command.split())
    return words.removeprefix("attnbench ") or "-"


def runs(
    db: common.Db = None,
    full: Annotated[bool, typer.Option("--full", help="Every device and command whole, folded over lines.")] = False,
) -> None:
    """List the runs of a results file, one line each: id, when, status, device, cases ok of the run's, command."""
    import datetime

    from rich import box
    from rich.table import Table

    from attnbench.report.safe_text import markup
    with open_store(db) as store:
        listed = store.runs()
        counts = dict(((r, s), n) for r, s, n in store.conn.execute(
            "SELECT run_id, status = 'ok', COUNT(*) FROM records GROUP BY run_id, status = 'ok'"))
        devices = {r["run_id"]: (store.env(r["env_id"] or "") or {}) for r in listed}
    if not listed:
        common.console.print(f"{store.path} holds no runs", highlight=False, markup=False)
        return
    table = Table(title=markup(f"runs in {store.path}"), header_style="bold", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), caption=None if full else
                  "devices and commands cut to fit: attnbench runs --full", caption_justify="left")
    # One line per run: what a user copies into `show` / `compare` (the id) stays whole, the short columns too;
    # the device and the command are cut to the width left (--full folds them instead).
    years = {time.localtime(r["created_at"]).tm_year for r in listed if r["created_at"]}
    stamp = "%Y-%m-%d %H:%M" if len(years) > 1 or full else "%m-%d %H:%M"  # one year: said in the header
    rows = []
    for r in listed:
        ok, bad = counts.get((r["run_id"], 1), 0), counts.get((r["run_id"], 0), 0)
        planned = planned_cases(r, ok + bad)  # a stopped run's missing cases count against it
        when = datetime.datetime.fromtimestamp(r["created_at"]).strftime(stamp) if r["created_at"] else "-"
        env = devices[r["run_id"]]
        device, command = env.get("device_name") or "-", r["command"] or "-"
        if not full:
            device, command = short_device(device), short_command(command)
        rows.append((r["run_id"], when, r["status"] or "-", device, f"{ok}/{planned}", command))
    if len(years) == 1 and not full:
        table.title = markup(f"runs in {store.path}, started in {years.pop()}")
    heads = ("run", "started", "status", "device", "ok", "command")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    if not full:  # the short columns whole, the device cut at DEVICE_WIDTH, the command in what is left
        widths[3] = min(widths[3], DEVICE_WIDTH)
        widths[5] = max(len(heads[5]), common.console.width - sum(widths[:5]) - 2 * (len(heads) - 1) - 1)
        # (each column's right padding and the divider: 2 columns between two; 1 left for the terminal)
    cut = "fold" if full else "ellipsis"
    for i, head in enumerate(heads):
        short = i not in (3, 5)
        table.add_column(head, justify="right" if head == "ok" else "left", no_wrap=short or not full,
                         overflow="fold" if short else cut, min_width=widths[i] if short else None,
                         max_width=None if short or full else widths[i])
    for row in rows:
        table.add_row(*map(markup, row))  # whatever the store holds, shown as text
    common.console.print(table)


def repair(db: common.Db = None) -> None:
    """Keep one record per case of each run (the first one written) in a store that holds more.

    Such stores were written by attnbench before the store itself forbade duplicates (concurrent writers,
    resumes of a live run). The file is checked first and replaced whole by a repaired copy; any refusal
    leaves it as it was."""
    from attnbench.results import repair as repairmod
    done = repairmod.repair(Path(db or DEFAULT_DB))
    common.console.print(f"removed {done.removed} duplicate record{'s' * (done.removed != 1)} from {done.path} "
                         f"({done.kept} kept: the first of each case)" if done.removed else
                         f"{done.path} holds one record per case already; nothing changed", highlight=False,
                         markup=False)

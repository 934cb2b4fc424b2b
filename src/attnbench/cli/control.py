"""Run control for `attnbench run`: --resume, Ctrl-C handling, --isolate / --case-timeout.

Resume re-runs a run's stored options (the ``config`` column of the runs table holds the merged
options of the command that started it) and skips every case that already has a record.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import typer

from attnbench import interrupt
from attnbench.cli.common import MAX_WAIT_S, UserError, check_db_path, shown
from attnbench.results.store import DEFAULT_DB, ResultStore, check_run_id

RESUME_OVERRIDES = ("db", "quiet", "isolate", "case_timeout", "output", "resume")
"""Options that may accompany --resume; the sweep itself always comes from the stored run."""


def _flag(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def _explicit(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def resumed_options(ctx: typer.Context) -> dict:
    """The stored options of run ``--resume ID``, with the few allowed overrides; UserError otherwise."""
    run_id = str(ctx.params["resume"]).strip()
    try:  # the id names the run's files (report, plots) as a new one does
        check_run_id(run_id, "--resume")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    given = [_flag(name) for name in ctx.params if _explicit(ctx, name) and name not in RESUME_OVERRIDES]
    if given:
        raise UserError(f"--resume {run_id} re-runs that run's stored options: drop {', '.join(given)} "
                        f"(allowed with --resume: {', '.join(_flag(n) for n in RESUME_OVERRIDES[:-1])})")
    db = check_db_path(Path(ctx.params.get("db") or DEFAULT_DB))
    if not db.is_file():
        raise UserError(f"--resume {run_id}: no results database at {db} (use --db PATH)")
    with ResultStore(db, readonly=True) as store:
        run = store.run(run_id)
        if run is None:
            recent = [r["run_id"] for r in store.runs()][-5:][::-1]  # the newest first
            raise UserError(f"unknown run id {run_id!r} in {db}; "
                            + (f"latest runs there: {', '.join(recent)}" if recent else "it holds no runs"))
    try:
        opts = json.loads(run["config"] or "{}")
    except json.JSONDecodeError:
        opts = None
    if not isinstance(opts, dict):
        raise UserError(f"run {run_id} in {db} has no readable stored options; it cannot be resumed")
    for name in RESUME_OVERRIDES:
        if _explicit(ctx, name):
            opts[name] = ctx.params[name]
    opts["db"], opts["resume"], opts["quiet"] = str(db), run_id, bool(ctx.params.get("quiet"))
    return opts


def case_timeout(value) -> float | None:
    """--case-timeout SECONDS: a positive number, at most MAX_WAIT_S."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (0 < seconds <= MAX_WAIT_S):
        raise UserError(f"bad --case-timeout {shown(value)}: give a number of seconds in (0, {MAX_WAIT_S:g}], "
                        "like 600")
    return seconds


def make_runner(plan, **kwargs):
    """A Runner, or an IsolatedRunner (worker processes) for --isolate / --case-timeout."""
    if plan.isolate:
        from attnbench.runner import IsolatedRunner
        return IsolatedRunner(plan.options, case_timeout=plan.case_timeout, **kwargs)
    from attnbench.runner import Runner
    return Runner(plan.options, **kwargs)


def resume_hint(run_id: str, db: Path) -> str:
    return f"resume with: attnbench run --resume {run_id} --db {shlex.quote(str(db))}"


STOPPING = b"\nattnbench: stopping after the case in flight (Ctrl-C again to abort)\n"


@contextmanager
def stop_on_sigint(runner, announced: bool = False):
    """First Ctrl-C: ``runner.stop_requested`` (the case in flight finishes); second: KeyboardInterrupt.
    ``announced``: the stop watcher (``inflight.stop_at_once``) prints the first one's line, at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def handler(signum, frame):
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        runner.stop_requested = True
        if not announced:  # os.write: safe inside a signal handler, whatever the progress bar is doing
            os.write(2, STOPPING)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        interrupt.check()  # one that arrived before the handler was in place, and was swallowed on the way
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

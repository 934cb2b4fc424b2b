"""attnbench command line: ``attnbench COMMAND``; each command lives in its own module.

Errors in what the user typed or configured are one line on stderr and exit status 2; an unexpected
failure is one line and exit status 1 (set ATTNBENCH_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys

import typer

from attnbench import interrupt
from attnbench.cli import calibrate as calibrate_cmd
from attnbench.cli import common, info, view
from attnbench.cli import compare as compare_cmd
from attnbench.cli import cp_model as cp_model_cmd
from attnbench.cli import dist as dist_cmd
from attnbench.cli import e2e as e2e_cmd
from attnbench.cli import links as links_cmd
from attnbench.cli import run as run_cmd
from attnbench.cli import verify as verify_cmd
from attnbench.results.files import FileRefused
from attnbench.results.store import BadRunId, StoreError

# typer may vendor its own click: take the exception classes from wherever typer's come from.
_click_exceptions = sys.modules[typer.BadParameter.__module__]
UsageError = _click_exceptions.UsageError
NoArgsIsHelpError = getattr(_click_exceptions, "NoArgsIsHelpError", ())

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Benchmark, verify and compare attention kernels.")
def _version(value: bool) -> None:
    if value:
        from attnbench.version import __version__
        common.console.print(f"attnbench {__version__} (torch {torch_version()})", highlight=False)
        raise typer.Exit(0)


def torch_version() -> str:
    """The installed torch's version, read from its package metadata: importing torch takes a second."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch on the path without metadata (a source tree)
        import torch

        return torch.__version__


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print attnbench's version and exit.")) -> None:
    """Benchmark, verify and compare attention kernels."""


app.command("run")(run_cmd.run)
app.command("verify")(verify_cmd.verify)
app.command("backends")(info.backends)
app.command("env")(info.env)
app.command("presets")(info.presets)
app.command("calibrate")(calibrate_cmd.calibrate)
app.command("e2e")(e2e_cmd.e2e)
app.command("dist")(dist_cmd.dist)
app.command("cp-model")(cp_model_cmd.cp_model)
app.command("links")(links_cmd.links)
app.command("plot")(view.plot)
app.command("report")(view.report)
app.command("export")(view.export)
app.command("show")(view.show)
app.command("runs")(view.runs)
app.command("compare", cls=compare_cmd.PlainUsage)(compare_cmd.compare)
app.command("merge", cls=compare_cmd.PlainUsage)(compare_cmd.merge)
app.command("repair")(view.repair)


def _without_flag_types(command):
    """Help shows no value type for flags (some typer versions print ``--json <bool>`` as if it took one)."""
    for sub in [command, *getattr(command, "commands", {}).values()]:
        for param in sub.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        get_help_option = sub.get_help_option

        def help_option(ctx, _get=get_help_option):
            option = _get(ctx)
            if option is not None and option.metavar is None:
                option.metavar = ""
            return option
        sub.get_help_option = help_option
    return command


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(value: str | None) -> str:
    """$ATTNBENCH_LOG: a logging level name (unset or empty: WARNING)."""
    if not (value or "").strip():
        return "WARNING"
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise common.UserError(f"bad ATTNBENCH_LOG {common.shown(value)}; allowed: {', '.join(LOG_LEVELS)} "
                               "(any case)")
    return level


def debug_flag(value: str | None) -> bool:
    """$ATTNBENCH_DEBUG: 1/true/yes/on show tracebacks; unset, empty, 0/false/no/off do not."""
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise common.UserError(f"bad ATTNBENCH_DEBUG {common.shown(value)}; use 1 (tracebacks on) or 0")


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    try:
        level, debug = log_level(os.environ.get("ATTNBENCH_LOG")), debug_flag(os.environ.get("ATTNBENCH_DEBUG"))
    except common.UserError as exc:
        common.fail(str(exc), 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        argv = common.normalize_argv(list(sys.argv[1:] if argv is None else argv))
        common.remember_invocation(argv)
        command = _without_flag_types(typer.main.get_command(app))
        code = command.main(args=argv, prog_name="attnbench", standalone_mode=False)
    except NoArgsIsHelpError:  # bare `attnbench`: typer has printed the help already
        code = 0
    except UsageError as exc:
        where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        common.fail(where + " ".join(exc.format_message().split()), 2)
    except (typer.Abort, KeyboardInterrupt):  # click turns Ctrl-C (and SIGTERM/SIGHUP, see entry.py) into Abort
        common.fail(interrupt.stopped(), interrupt.exit_status())
    except (common.UserError, BadRunId, FileNotFoundError, StoreError, FileRefused) as exc:
        if debug:
            raise
        common.fail(" ".join(str(exc).split()), 2)
    except sqlite3.DatabaseError as exc:
        if debug:
            raise
        if isinstance(exc, sqlite3.OperationalError):  # locked, disk full, I/O: not the file's content
            common.fail(f"results database: {' '.join(str(exc).split())} (SQLite) (set ATTNBENCH_DEBUG=1 for "
                        "details)", 1)
        # damage where no check looked: a reader, or an old record of a big store
        common.fail(f"a results database could not be read: {' '.join(str(exc).split())} (SQLite); the file is "
                    "damaged: keep a copy and read what is left with export", 2)
    except Exception as exc:  # never a traceback for users; ATTNBENCH_DEBUG=1 shows it
        if debug:
            raise
        common.fail(f"{type(exc).__name__}: {' '.join(str(exc).split())} (set ATTNBENCH_DEBUG=1 for details)", 1)
    if interrupt.received:  # typer turns KeyboardInterrupt into a silent exit status 130
        common.fail(interrupt.stopped(), interrupt.exit_status())
    sys.exit(code if isinstance(code, int) else 0)

"""The ``attnbench`` console entry point.

It installs the signal handling before anything heavy is imported, so that Ctrl-C, SIGTERM or SIGHUP at any
moment (even while torch is importing) ends the command with one line and exit status 128 + signal, never a
traceback. A running sweep handles them itself (``cli/control.py``): the run is marked and the resume command
printed.
"""

from __future__ import annotations

import signal
import sys

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
received: list[int] = []
"""Signals that stopped this process (the exit status is 128 + the first)."""


def stop(signum, frame) -> None:
    """Ctrl-C, SIGTERM, SIGHUP: stop the command (remembering which signal, for the exit status)."""
    received.append(signum)
    raise KeyboardInterrupt


def exit_status() -> int:
    return 128 + (received[0] if received else signal.SIGINT)


def stopped() -> str:
    """How the command was stopped, for its last line."""
    if not received or received[0] == signal.SIGINT:
        return "interrupted"
    return f"stopped by {signal.Signals(received[0]).name}"


def main() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    try:
        from attnbench.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("attnbench: error: interrupted\n")
        sys.exit(exit_status())
    cli_main()

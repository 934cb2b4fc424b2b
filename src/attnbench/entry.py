"""The ``attnbench`` console entry point.

It installs the signal handling before anything heavy is imported, so that Ctrl-C, SIGTERM or SIGHUP at any
moment (even while torch is importing) ends the command with one line and exit status 128 + signal, never a
traceback. A running sweep handles them itself (``cli/control.py``): the run is marked and the resume command
printed.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from attnbench.interrupt import STOP_SIGNALS, exit_status, received, stop, stopped


def _leave(code: int) -> None:
    """Exit now with ``code``. After a signal, Python may still exit "killed by SIGINT" (status -2) if the
    KeyboardInterrupt passed through C code running Python source (an extension's import does): os._exit
    keeps the status we chose. Everything that had to be saved was saved on the way out."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _unraisable(info) -> None:
    """A stop signal that arrived while Python ran a callback it cannot raise from (a weakref callback of the
    import system, a ``__del__``): Python would print "Exception ignored" with a traceback and go on as if no
    signal had come. Stop here instead, with the one line. (A sweep in flight is then left marked running; its
    process is gone, so ``attnbench run --resume`` takes it up as any stale run.)"""
    if isinstance(info.exc_value, KeyboardInterrupt):
        sys.stderr.write(f"attnbench: error: {stopped()}\n")
        _leave(exit_status())
    sys.__unraisablehook__(info)


def main() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    sys.unraisablehook = _unraisable
    try:
        from attnbench.cli import main as cli_main
    except BaseException:  # numpy turns a KeyboardInterrupt inside its import into an ImportError
        if not received:
            raise
        sys.stderr.write(f"attnbench: error: {stopped()}\n")
        _leave(exit_status())
    try:
        # torch and the CLI stay for the whole process: the collections that importing the kernel packages
        # sets off need not walk them again (0.1-0.4 s each, growing with every package imported).
        gc.freeze()
        cli_main()
    except KeyboardInterrupt:  # a signal held back during an import, raised again before the CLI took over
        sys.stderr.write(f"attnbench: error: {stopped()}\n")
        _leave(exit_status())
    except SystemExit as exc:
        for signum in STOP_SIGNALS:  # the command has finished: a stop signal now must not become a traceback
            signal.signal(signum, _late)
        if received:
            _leave(exc.code if isinstance(exc.code, int) else 1)
        raise
    finally:
        gc.freeze()  # the collection at interpreter exit then skips what is freed at exit anyway (0.5 s)


def _late(signum, frame) -> None:
    """A stop signal while the finished command exits (torchrun stops the other ranks of a failed job): exit at
    once with 128 + the signal, without a word (a KeyboardInterrupt here printed a traceback from this file)."""
    received.append(signum)
    _leave(128 + signum)

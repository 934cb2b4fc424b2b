"""The ``attnbench`` console entry point.

It installs the signal handling before anything heavy is imported, so that Ctrl-C, SIGTERM or SIGHUP at any
moment until the command has finished (while torch is importing, they are held back until the import is over)
ends the command with one line and exit status 128 + signal, never a traceback. A running sweep handles them
itself (``cli/control.py``): the run is marked and the resume command printed. Once the command has finished,
they are ignored: the exit status is the command's.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from attnbench.interrupt import STOP_SIGNALS, check, exit_status, received, stop, stopped


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


def _import_cli():
    """``attnbench.cli.main``, imported with the stop signals held back by the kernel until the import is over.

    Importing the CLI imports torch, numpy and torch.distributed, whose C++ initialisers (``_c10d_init``) call
    back into Python: a KeyboardInterrupt raised there cannot cross the C++ frames, and the process aborts
    ("terminate called ...") instead of stopping. ``interrupt.stop`` holds back a signal that lands inside an
    import by looking for the import system's frames, and raises it again 50 ms later; that rests on a frame
    heuristic and on timing. Blocked here, a signal sent during the import (a second or more on a busy machine)
    stays pending and is delivered when the import is over, in this thread. Threads started by the import
    inherit the blocked signals, so none of them takes it meanwhile."""
    held = hasattr(signal, "pthread_sigmask")  # not on Windows, where these signals are not sent anyway
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        from attnbench.cli import main as cli_main
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return cli_main


def main() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    sys.unraisablehook = _unraisable
    try:
        cli_main = _import_cli()
        check()  # a signal held back by the import lands here, outside it
    except BaseException:  # numpy turns a KeyboardInterrupt inside its import into an ImportError
        if not received:
            raise
        sys.stderr.write(f"attnbench: error: {stopped()}\n")
        _leave(exit_status())
    try:
        try:
            # torch and the CLI stay for the whole process: the collections that importing the kernel packages
            # sets off need not walk them again (0.1-0.4 s each, growing with every package imported).
            gc.freeze()
            cli_main()
        except SystemExit as exc:
            _finished()
            if received:
                _leave(exc.code if isinstance(exc.code, int) else 1)
            raise
    except KeyboardInterrupt:  # held back during an import and raised again before the CLI took over, or one
        # that landed as the command finished, before the line above ignored them
        sys.stderr.write(f"attnbench: error: {stopped()}\n")
        _leave(exit_status())
    finally:
        gc.freeze()  # the collection at interpreter exit then skips what is freed at exit anyway (0.5 s)


def _finished() -> None:
    """The command has finished (its output written, its exit status chosen): a stop signal from now on
    interrupts nothing, and is ignored. A handler of ours cannot cover the exit: once Python's finalization
    starts (module teardown, a second or more after an e2e run), it puts back the default action of each signal
    that has a Python handler, and a Ctrl-C then killed the process, status -2, without a word. The signals
    ignored here stay ignored to the end, and the exit status is the command's. (torchrun stops the other ranks
    of a failed job with SIGTERM: a rank that has finished exits as it was going to.)"""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)

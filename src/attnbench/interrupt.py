"""Which stop signal ended this command: Ctrl-C (SIGINT), SIGTERM or SIGHUP.

The console entry point (``entry``) installs ``stop`` as their handler before anything heavy is imported; the
CLI reads what arrived to end with one line and exit status 128 + the signal.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
received: list[int] = []
"""Signals that stopped this process (the exit status is 128 + the first)."""


REDELIVER_S = 0.05
_redelivered: list[int] = []


def stop(signum, frame) -> None:
    """Ctrl-C, SIGTERM, SIGHUP: stop the command (remembering which signal, for the exit status).

    Not while a module is being imported: an extension's C++ initialiser that calls back into Python (torch's
    ``_c10d_init`` does) cannot carry an exception out, and the process aborts ("terminate called ...") instead
    of stopping. The signal is then recorded and raised again shortly, until it lands outside any import."""
    if _redelivered and _redelivered[-1] == signum:
        _redelivered.pop()
    else:
        received.append(signum)
    if _importing(frame):
        _redeliver(signum)
        return
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    def again() -> None:
        _redelivered.append(signum)
        signal.pthread_kill(main, signum)

    main = threading.main_thread().ident
    timer = threading.Timer(REDELIVER_S, again)
    timer.daemon = True
    timer.start()


def check() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived already: one that landed while a library was being
    imported can be swallowed by the import machinery, and a command must not start its work after it."""
    if received:
        raise KeyboardInterrupt


def first() -> int:
    """The signal that stopped the command: SIGINT where none was recorded (a run's second Ctrl-C)."""
    return received[0] if received else signal.SIGINT


def exit_status() -> int:
    return 128 + first()


def stopped(signum: int | None = None) -> str:
    """How the command was stopped (by ``signum``, default the first signal received), for its last line."""
    signum = first() if signum is None else signum
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"

"""The case in flight in `attnbench run`: progress while it runs long, and a stop at once however long it runs.

A CPU case can spend minutes inside one native call (a bf16 matmul on a CPU without bf16 instructions). Python
runs a signal handler only between bytecodes, so SIGTERM then waited for the call to end (55-60 s), and a log
showed no progress meanwhile. Both come from threads here: torch releases the interpreter lock inside its
calls, so a thread runs while the main thread waits in one.

- ``heartbeat``: once a case has run ``AFTER_S``, its elapsed time and estimate every second to the progress
  (a log line every 5 s, or the live bar's description).
- ``stop_at_once``: the C-level signal handler writes each signal's number to a pipe (``signal.set_wakeup_fd``)
  at once, wherever the main thread is; a watcher thread blocked on the pipe sees SIGTERM, SIGHUP or a second
  Ctrl-C and gives the main thread ``GRACE_S`` to stop the usual way (its handler raises KeyboardInterrupt,
  ``execute`` records and reports the stop). If the main thread has not left the run by then, it is inside a
  long call: the watcher records the case in flight as abandoned (status error, ``ABANDONED`` reason: a resumed
  run runs it again), marks the run interrupted, prints the stop lines and ends the process with 128 + the
  signal. Whichever of the two stops the run first owns the stop (``_owner``); the other waits or returns.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from attnbench import interrupt
from attnbench.cli import control
from attnbench.results.record import ABANDONED, Record
from attnbench.results.store import record_stop
from attnbench.spec import AttnSpec
from attnbench.timing import estimate

AFTER_S = 5.0
"""A case running this long gets progress of its own (``heartbeat``): the log's line every 5 s."""
GRACE_S = 0.5
"""How long the main thread gets to stop the usual way after a stop signal before the watcher stops the run."""


def describe(spec: AttnSpec, backend: str) -> str:
    """'naive b1 s1024 h8 d128 bf16 causal fwd': a case as the progress names it."""
    return f"{backend} {spec.label()} {spec.pass_}"


class InFlight:
    """The case the runner is on, from ``Runner.on_case`` until its record is stored (``stored``), and how long
    it should take. ``lock`` is held while a record is stored and while the watcher records a stop, so a case is
    stored once, as measured or as abandoned."""

    def __init__(self, expected_s: Callable[[AttnSpec], float | None] | None = None):
        self.lock = threading.Lock()
        self.expected_s = expected_s or (lambda spec: None)
        """The estimate of a case's seconds (``timing.estimate.case_seconds``), None where there is none."""
        self.case: tuple[AttnSpec, str] | None = None
        self.started = 0.0
        self._spent = self._expected = 0.0  # over the cases timed so far: seconds taken, seconds estimated

    def start(self, spec: AttnSpec, backend: str) -> None:
        with self.lock:
            self.case, self.started = (spec, backend), time.perf_counter()

    def stored(self, record: Record) -> None:
        """The case's record is stored (call under ``lock``); a timed case teaches the run's pace."""
        if self.case is not None and record.n:
            expected = self.expected_s(self.case[0])
            if expected:
                self._spent += time.perf_counter() - self.started
                self._expected += expected
        self.case = None

    def running(self) -> tuple[AttnSpec, str, float] | None:
        """(spec, backend, seconds it has run) of the case in flight, or None."""
        case, started = self.case, self.started
        return None if case is None else (*case, time.perf_counter() - started)

    def expected(self, spec: AttnSpec) -> str | None:
        """How long ``spec`` should take: '~40 s' at the pace of the cases timed so far, '10–40 s' before any
        (``estimate.SLOWER``), None without an estimate."""
        seconds = self.expected_s(spec)
        if not seconds:
            return None
        if self._expected:
            paced = estimate.duration(seconds * self._spent / self._expected)
            return paced if paced.startswith("<") else "~" + paced
        return estimate.span(seconds, seconds * estimate.SLOWER)


@contextmanager
def heartbeat(inflight: InFlight, show: Callable[[str, float, str | None], None], after_s: float = AFTER_S,
              tick_s: float = 1.0):
    """Call ``show(what, elapsed_s, expected)`` every ``tick_s`` while a case has been in flight ``after_s`` or
    more (from a thread of its own)."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(tick_s):
            running = inflight.running()
            if running is not None and running[2] >= after_s:
                spec, backend, elapsed = running
                show(describe(spec, backend), elapsed, inflight.expected(spec))

    thread = threading.Thread(target=beat, name="attnbench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def abandoned(running: tuple[AttnSpec, str, float], runner, signum: int) -> Record:
    """The record of the case in flight (``InFlight.running``), abandoned on stop signal ``signum``."""
    spec, name, elapsed = running
    backend = next(b for b in runner.backends if b.name == name)
    how = "Ctrl-C twice" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return runner._record(spec, backend, status="error", reason=f"{ABANDONED}{how} after {elapsed:.0f} s of the case",
                          info=backend.base_info())


def record_abandoned(inflight: InFlight, runner, signum: int, db: Path, run_id: str) -> str:
    """Mark the run interrupted and store the case in flight as abandoned; the words the stop line gives it
    ('; naive b1 ... fwd abandoned after 35 s (...)'), empty when there was none, its own record was stored
    meanwhile, or the store could not be written (the run is then marked when it is next opened)."""
    running = inflight.running()
    try:
        if not record_stop(db, run_id, abandoned(running, runner, signum) if running else None):
            return ""
    except sqlite3.Error:
        return ""
    spec, name, elapsed = running
    return f"; {describe(spec, name)} abandoned after {elapsed:.0f} s (recorded as an error; --resume runs it again)"


class _Watch:
    """The stop watcher of one run (``stop_at_once``)."""

    def __init__(self, inflight: InFlight, runner, db: Path, run_id: str, hint: str, before_exit: Callable[[], None]):
        self.inflight, self.runner, self.db, self.run_id, self.hint = inflight, runner, db, run_id, hint
        self.before_exit = before_exit
        self._owner = threading.Lock()
        """Taken by whichever of the main thread and the watcher stops the run."""
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)  # the C handler must never block on it
        self.thread = threading.Thread(target=self._watch, name="attnbench-stop", daemon=True)

    def claim(self) -> bool:
        return self._owner.acquire(blocking=False)

    def _watch(self) -> None:
        presses = 0
        while True:
            signum = os.read(self.read, 1)[0]
            if signum == 0:  # the run is over (``stop_at_once``'s exit)
                return
            if signum == signal.SIGINT:
                presses += 1
                if presses == 1:  # the first Ctrl-C: the case in flight finishes (the handler sets it too)
                    self.runner.stop_requested = True
                    os.write(2, control.STOPPING)
                    continue
            elif signum not in interrupt.STOP_SIGNALS:
                continue
            time.sleep(GRACE_S)  # the main thread may stop the usual way meanwhile (it then owns the stop)
            if self.claim():
                self._stop(signum)
            return

    def _stop(self, signum: int) -> None:
        """Record the stop, print its lines and end the process: the main thread is inside a long call."""
        words = ""
        try:
            self.before_exit()
            if self.inflight.lock.acquire(timeout=2.0):  # a record being stored is stored first; none after
                words = record_abandoned(self.inflight, self.runner, signum, self.db, self.run_id)
        except BaseException:  # the store is locked or gone: --resume takes up the run (marked when reopened)
            pass
        try:
            os.write(2, f"attnbench: aborted{words}; {self.hint}\nattnbench: error: {interrupt.stopped(signum)}\n"
                     .encode())
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        except BaseException:  # stderr gone (a closed terminal after SIGHUP)
            pass
        os._exit(128 + signum)


def watchable() -> bool:
    """Whether ``stop_at_once`` can watch here: in the main thread of the ``attnbench`` command, whose entry point
    installed ``interrupt.stop``; a program calling the API keeps its own signals and its process."""
    return threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) is interrupt.stop


@contextmanager
def stop_at_once(inflight: InFlight, runner, *, db: Path, run_id: str, hint: str, enabled: bool = True,
                 before_exit: Callable[[], None] = lambda: None):
    """Stop the run within ``GRACE_S`` of SIGTERM, SIGHUP or a second Ctrl-C, even inside a long native call
    (module docstring), if ``enabled`` and ``watchable``. The first Ctrl-C's line is then the watcher's, printed
    at once (``control.stop_on_sigint(announced=True)``)."""
    if not (enabled and watchable()):
        yield
        return
    watch = _Watch(inflight, runner, db, run_id, hint, before_exit)
    previous = signal.set_wakeup_fd(watch.write, warn_on_full_buffer=False)
    watch.thread.start()
    try:
        yield
    finally:
        if watch.claim():  # the run ends here (done, or stopping the usual way): the watcher is not needed
            signal.set_wakeup_fd(previous)
            os.write(watch.write, b"\0")
            watch.thread.join()
            os.close(watch.read)
            os.close(watch.write)
        else:  # the watcher is stopping the run and ends the process
            while True:
                try:
                    watch.thread.join()
                except BaseException:  # a further signal: keep waiting for the watcher's exit
                    continue

"""Process isolation: each case runs in a worker subprocess (``attnbench.worker``); the parent stores it.

A segfault, an abort or an illegal memory access kills (or poisons) only the worker: that case is
recorded as status "error" with the reason ("worker died with signal 11 (SIGSEGV)") and the next case
gets a fresh worker. ``case_timeout`` kills a worker whose case runs too long ("timed out after N s").
A worker is reused for the following cases while they succeed, so the interpreter and torch start-up
are paid once, not per case; after any case with status "error" it is replaced, because a CUDA error
can leave the device context unusable for everything that follows in that process.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attnbench
from attnbench.backends.base import Backend
from attnbench.results.record import Record
from attnbench.runner import Runner
from attnbench.spec import AttnSpec

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 300.0
"""Longest wait for a worker to import torch and the backends (first CUDA init can be slow)."""


class WorkerDied(RuntimeError):
    """The worker process ended; the message says how."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer in time."""


def describe_exit(returncode: int | None) -> str:
    """'worker died with signal 11 (SIGSEGV)' / 'worker exited with status 3'."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"worker died with signal {-returncode} ({name})"
    return f"worker exited with status {returncode}"


def crash_line(text: str) -> str:
    """The line of a worker's stderr that says why it died: Python's "Fatal Python error: ..." when there is
    one, else the last line that is not part of a stack; cut to 200 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    stack = ("File ", "Current thread", "Thread 0x", "Extension modules:", "Traceback", "<no Python frame>")
    rest = [line for line in lines if not line.startswith(stack) and not line.startswith("0x")]
    line = (fatal or rest[-1:] or [""])[0]
    return line if len(line) <= 200 else line[:199] + "…"


class Worker:
    """One ``python -m attnbench.worker`` process and its line protocol."""

    def __init__(self, setup: dict, startup_timeout: float = STARTUP_TIMEOUT_S):
        env = dict(os.environ)
        # The worker runs the same attnbench as the parent, installed or not.
        root = str(Path(attnbench.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # The worker's stderr (kernel messages, a crash's "Fatal Python error" stack) goes to a file: a crash is
        # one line in its record, the whole text is logged (ATTNBENCH_LOG=info), the terminal stays clean.
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "attnbench.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self._buffer = b""
        try:
            self.send({"setup": base64.b64encode(pickle.dumps(setup)).decode()})
            self.receive(startup_timeout)
        except WorkerTimeout:
            self.close(kill=True)
            raise WorkerDied(f"worker did not start within {startup_timeout:g} s") from None
        except BaseException:
            self.close(kill=True)
            raise

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._exit_reason()) from None

    def receive(self, timeout: float | None) -> dict:
        """The next message; WorkerTimeout after ``timeout`` s, WorkerDied if the process ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise WorkerTimeout(f"no answer in {timeout:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerDied(self._exit_reason())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _exit_reason(self) -> str:
        try:
            returncode = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = self.proc.returncode
        last = crash_line(self.stderr_text())
        return describe_exit(returncode) + (f": {last}" if last else "")

    def stderr_text(self, limit: int = 1 << 16) -> str:
        """The last ``limit`` bytes the worker wrote to stderr."""
        try:
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - limit))
            return self.stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self, kill: bool = False) -> None:
        """End of input: the worker exits after its current case (killed if it does not, or at once)."""
        if kill:
            self.kill()
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
        self.proc.stdout.close()
        text = self.stderr_text()
        if text.strip():
            log.info("worker %d wrote to stderr:\n%s", self.proc.pid, text.rstrip())
        self.stderr.close()


class IsolatedRunner(Runner):
    """A Runner whose cases run in worker processes; records still go through ``sink`` in this process."""

    def __init__(self, *args, case_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if case_timeout is not None and not case_timeout > 0:
            raise ValueError(f"case timeout must be positive, got {case_timeout!r}")
        self.case_timeout = case_timeout
        self._worker: Worker | None = None
        self._setup = {"options": self.options, "run_id": self.run_id, "env_id": self.env_id,
                       "checker": self.checker}
        try:
            pickle.dumps(self._setup)
        except Exception as exc:
            raise ValueError(f"isolated runs need picklable options and a module-level checker: {exc}") from None

    def run(self, specs) -> list[Record]:
        return self.run_cases(self.cases(specs))

    def run_cases(self, cases, stopped: Callable[[], bool] | None = None) -> list[Record]:
        """Each (spec, backend) in a worker, stored through ``sink``; ``stopped`` (default: this runner's
        ``stop_requested``) is asked before each case."""
        stopped = stopped or (lambda: self.stop_requested)
        records: list[Record] = []
        try:
            for spec, backend in cases:
                if stopped():
                    break
                if self.on_case:
                    self.on_case(spec, backend.name)
                with self.clock.phase("isolated"):
                    record = self.run_isolated(spec, backend)
                self.sink(record)
                records.append(record)
        except BaseException:  # second Ctrl-C, a failing sink: do not wait for the case in flight
            self.close(kill=True)
            raise
        self.close()
        return records

    def run_isolated(self, spec: AttnSpec, backend: Backend) -> Record:
        """One case in a worker; a dead, hung or failing worker becomes this case's "error" record."""
        unsupported = backend.supports(spec, self.device)
        if unsupported:  # no worker makes the inputs of a case no backend takes
            return self._record(spec, backend, status="unsupported", reason=unsupported, info=backend.base_info())
        try:
            if self._worker is None:
                self._worker = Worker(self._setup, max(STARTUP_TIMEOUT_S, self.case_timeout or 0))
            self._worker.send({"spec": spec.to_dict(), "backend": backend.name})
            answer = self._worker.receive(self.case_timeout)
        except WorkerTimeout:
            self.close(kill=True)
            return self._record(spec, backend, status="error", reason=f"timed out after {self.case_timeout:g} s",
                                info=backend.base_info())
        except WorkerDied as exc:
            self.close()
            log.warning("%s %s: %s", backend.name, spec.label(), exc)
            return self._record(spec, backend, status="error", reason=str(exc), info=backend.base_info())
        record = Record.from_row(answer["row"])
        if record.status == "error":
            self.close()
        return record

    def close(self, kill: bool = False) -> None:
        """Stop the worker (if any)."""
        if self._worker is not None:
            worker, self._worker = self._worker, None
            worker.close(kill=kill)

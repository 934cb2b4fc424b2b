"""Backends that misbehave on purpose, for the reliability tests.

Loaded through ``ATTNBENCH_PLUGINS=attnbench_test_backends`` (with this folder on PYTHONPATH), so
they exist in every attnbench process, isolated workers included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Prepared

SLEEP_S = float(os.environ.get("ATTNBENCH_TEST_SLEEP_S", "0.01"))


class Segfault(Backend):
    """Kills its own process with SIGSEGV in the timed call (like a kernel writing out of bounds)."""

    name = "test-segv"
    description = "test: segfaults"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        def crash():
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)  # the signal is delivered before this returns
        return Prepared(fn=crash)


class NullRead(Backend):
    """Reads address 0 (a real segfault, not a sent signal)."""

    name = "test-nullread"
    description = "test: dereferences NULL"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        return Prepared(fn=lambda: ctypes.string_at(0))


class Abort(Backend):
    """Aborts the process (what a failed device assertion does)."""

    name = "test-abort"
    description = "test: aborts"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        return Prepared(fn=os.abort)


class Hang(Backend):
    """Never returns (a deadlocked kernel)."""

    name = "test-hang"
    description = "test: hangs"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        def hang():
            time.sleep(3600)
        return Prepared(fn=hang)


class Sleep(Backend):
    """A well-behaved backend whose call takes $ATTNBENCH_TEST_SLEEP_S seconds (deterministic pacing)."""

    name = "test-sleep"
    description = "test: sleeps, then computes naive attention (so it passes accuracy checks)"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        from attnbench.backends.naive import NaiveBackend
        inner = NaiveBackend().prepare(spec, inputs).fn

        def call():
            time.sleep(SLEEP_S)
            return inner()
        return Prepared(fn=call)


class ContextLoss(Backend):
    """Fails the way an illegal memory access does on a GPU; ``LOST`` then says the process's context is gone."""

    name = "test-context-loss"
    description = "test: a sticky device error"
    capabilities = Capabilities()
    LOST = False

    def prepare(self, spec, inputs):
        def fail():
            ContextLoss.LOST = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return Prepared(fn=fail)


for cls in (Segfault, NullRead, Abort, Hang, Sleep, ContextLoss):
    registry.register(cls.name, cls)

"""Isolated case worker: ``python -m attnbench.worker`` runs cases for a parent ``attnbench run --isolate``.

Protocol (one JSON object per line): the parent sends ``{"setup": base64(pickle({options, run_id,
env_id, checker}))}``; the worker answers ``{"ready": pid}``. Then for each case the parent sends
``{"spec": AttnSpec.to_dict(), "backend": name}`` and the worker answers ``{"row": Record.to_row()}``.
The worker never writes the store: the parent does, so a worker that dies loses only its case.
It exits at end of input. Anything a kernel prints goes to stderr, never into the protocol.
"""

from __future__ import annotations

import base64
import ctypes
import faulthandler
import json
import os
import pickle
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: be killed when the parent dies (even by SIGKILL), so no orphan keeps the device busy."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not fatal: end of input still stops the worker
        pass


def serve(lines, proto) -> None:
    """Answer ``lines`` (the protocol's requests) on ``proto``; see the module doc."""
    from attnbench import operators
    from attnbench.runner import Runner

    setup = pickle.loads(base64.b64decode(json.loads(next(lines))["setup"]))
    runner = Runner(setup["options"], run_id=setup["run_id"], env_id=setup["env_id"], sink=lambda record: None,
                    checker=setup.get("checker"))
    backends = {b.name: b for b in runner.backends}
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    proto.flush()
    inputs, inputs_key = None, None
    for line in lines:
        msg = json.loads(line)
        spec, backend = operators.spec_from_dict(msg["spec"]), backends[msg["backend"]]
        if spec.shape_key() != inputs_key:  # consecutive cases of one shape share their inputs
            inputs, inputs_key = None, spec.shape_key()
            inputs = runner.make_inputs_guarded(spec)
        if not isinstance(inputs, tuple):
            record = runner.run_case(spec, backend, inputs, check=runner.checker is not None)
        else:
            status, reason = inputs
            record = runner._record(spec, backend, status=status, reason=reason, info=backend.base_info())
        proto.write(json.dumps({"row": record.to_row()}) + "\n")
        proto.flush()


def main() -> None:
    proto = os.fdopen(os.dup(1), "w")  # the protocol keeps the real stdout ...
    os.dup2(2, 1)  # ... and fd 1 (C and Python prints) goes to stderr
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops after this case
    _die_with_parent()
    faulthandler.enable()  # a segfault prints the Python stack of the kernel call to stderr
    serve(iter(sys.stdin.readline, ""), proto)


if __name__ == "__main__":
    main()

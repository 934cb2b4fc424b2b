"""`attnbench dist --nproc N`: the ranks of one machine started by attnbench itself, as torchrun would.

The options are checked once, before any rank starts, so a wrong name is one line and exit status 2. The
ranks then run ``attnbench dist`` with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...): rank 0
prints, every rank that fails says why in one line, and the first rank to fail ends the others and gives the
exit status. Under torchrun a failed rank also brings torchrun's own report (its Python traceback), which no
rank can prevent.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

MAX_NPROC = 256
STOP_WAIT_S = 10.0
"""How long the other ranks get to end after one failed, before they are killed."""


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less ``--nproc N`` / ``--nproc=N`` (the ranks must not launch ranks)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, nproc: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # as torchrun does: the ranks share the cores instead of each starting a thread per core
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    root = str(Path(__file__).resolve().parents[2])  # the ranks run this attnbench, installed or not
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"died with signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"died with signal {-code}"
    return f"exited with status {code}"


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``attnbench ARGV`` (a dist command) as ``nproc`` ranks here; the exit status of the first rank that
    failed, else 0. A rank that dies without a word (a signal) gets one line here."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "attnbench", *argv], env=_rank_env(rank, nproc, port))
             for rank in range(nproc)]
    failed: tuple[int, int] | None = None
    try:
        while failed is None:
            codes = [p.poll() for p in procs]
            failed = next(((rank, code) for rank, code in enumerate(codes) if code not in (None, 0)), None)
            if all(code is not None for code in codes):
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
    if failed is None:
        return 0
    rank, code = failed
    if code < 0:  # a rank killed by a signal said nothing itself
        sys.stderr.write(f"attnbench: error: rank {rank} {_ended(code)}\n")
        return 128 - code
    return code


def _stop(procs: list[subprocess.Popen]) -> None:
    """End the ranks still running: SIGTERM (each says at most one line), SIGKILL after STOP_WAIT_S."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

"""attnbench's temporary files and folders, and the removal of those a killed process left behind.

What attnbench writes goes first to a temporary name: a new store (built whole, then linked into place), an
output (``files.write_atomic``), a repaired store (``repair``) beside the target, so that a rename puts it in
place whole; a private copy of a store to read (``store._read_log``) and a profiler's run of a case
(``timing/external.py``) in a folder of their own under the system's temporary folder. The process removes
them when it is done or fails, but a process killed in between (SIGKILL, the OOM killer, a power cut) cannot,
and they would stay forever: a hidden copy of a store beside it, a profiler's trace of gigabytes in /tmp.

So every such name says whose it is: ``<lead>.<host>-<pid>-<random>.attnbench-tmp`` (``<host>``: 8 hex digits
of a hash of the host name), with SQLite's side files of a temporary store after it (``-wal``, ``-shm``,
``-journal``). Each place that makes one first removes the stale ones in its folder (``remove_stale``), and so
does a command that opens a store to write it (beside the store; readers change nothing). Stale are those of
this host whose process is no longer running, and those of another host (a folder on a network file system)
untouched for ``STALE_ELSEWHERE_S``, since whether a process of another host runs cannot be asked. A name whose
process is alive is never touched, however old (a reader of a store may hold its copy for days); a pid reused
by another process keeps a stale name until that process ends too (kept too long, never removed too early).

Names that do not follow the pattern, files of other programs among them, are never touched; but for the two
names of earlier versions that say whose they are without saying the host (``.NAME.<pid>.<8 hex>.new`` of a
new store, ``.NAME.repair-<pid>`` of a repair, and their side files): those go as another host's do, once
their pid is not running here either. (Earlier versions' folders under the temporary folder,
``attnbench-XXXXXXXX``, name no process and are left alone.)
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path

MARK = "attnbench-tmp"
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
STALE_ELSEWHERE_S = 24 * 3600.0
"""A temporary name of another host's process is taken as stale once untouched this long: no write, copy or
profile of a case takes a day."""

_SIDE = r"(?:-wal|-shm|-journal)?$"
_NAME = re.compile(r"^(?P<lead>.+)\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-[0-9a-z_]+\." + MARK + _SIDE)
_EARLIER = (re.compile(r"^\.(?P<lead>.+)\.(?P<pid>[0-9]{1,10})\.[0-9a-f]{8}\.new" + _SIDE),
            re.compile(r"^\.(?P<lead>.+)\.repair-(?P<pid>[0-9]{1,10})" + _SIDE))
"""Temporary names of earlier versions, without a host."""


def process_started(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of /proc/PID/stat, clock ticks since boot), so a reused pid
    is not taken for the process that wrote a run; None where /proc cannot tell (or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int, started: str | None) -> bool:
    """Is the process that wrote a run still running? (Same host only.)"""
    if pid <= 0:
        return False  # os.kill(0 or -N) would ask about process groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # exists, not ours to signal (or cannot be asked)
    return started is None or process_started(pid) in (None, started)


def host_tag(host: str | None = None) -> str:
    """8 hex digits naming this host (or ``host``) in temporary names: a host name may hold dots and be long."""
    return hashlib.sha256((host or socket.gethostname()).encode()).hexdigest()[:8]


def temp_path(target: Path) -> Path:
    """A new temporary name beside ``target`` (hidden: ``.NAME.<host>-<pid>-<random>.attnbench-tmp``), after
    the stale ones in its folder are removed."""
    remove_stale(target.parent)
    return target.with_name(f".{target.name}.{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}.{MARK}")


def temp_dir(kind: str) -> Path:
    """A new folder ``attnbench-<kind>.<host>-<pid>-<random>.attnbench-tmp`` in the system's temporary folder,
    after the stale ones there are removed."""
    remove_stale(Path(tempfile.gettempdir()))
    return Path(tempfile.mkdtemp(prefix=f"attnbench-{kind}.{host_tag()}-{os.getpid()}-", suffix=f".{MARK}"))


def _ours(name: str) -> bool:
    return bool(_NAME.match(name) or any(p.match(name) for p in _EARLIER))


def stale(name: str, mtime: float, *, now: float | None = None) -> bool:
    """Is ``name`` a temporary name of attnbench whose process is gone (see the module doc)?"""
    found = _NAME.match(name)
    earlier = None if found else next((m for m in (p.match(name) for p in _EARLIER) if m), None)
    if found is None and earlier is None:
        return False
    old = (time.time() if now is None else now) - mtime > STALE_ELSEWHERE_S
    if found is not None and found["host"] != host_tag():  # another host's: its processes cannot be asked
        return old
    pid = int((found or earlier)["pid"])
    if pid == os.getpid() or process_alive(pid, None):
        return False
    return found is not None or old  # an earlier version's name may be another host's


def remove_stale(folder: Path) -> list[str]:
    """Remove the temporary files and folders in ``folder`` that attnbench processes left when they were killed
    (``stale``); the names removed. Best effort: what cannot be listed or removed stays, without a word (the
    command goes on; the next one tries again)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not _ours(entry.name):  # a folder's other names cost no stat
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stale(entry.name, info.st_mtime):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    return removed

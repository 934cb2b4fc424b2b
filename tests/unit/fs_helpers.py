"""Running `attnbench` against a folder that really is read-only, or a file system that really is full.

Permission bits do not stop root, so as root the folder is made read-only by a read-only bind mount, and a
full disk is a tiny tmpfs, each in a private mount namespace of the command (``unshare -m``): nothing outside
the command sees them. Where that is not allowed (no CAP_SYS_ADMIN), a test that needs them is skipped; as
another user, ``chmod`` makes the folder read-only.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_helpers import env

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@functools.cache
def can_mount() -> bool:
    """May this process mount in a private mount namespace (root with CAP_SYS_ADMIN, ``unshare`` present)?"""
    if not ROOT or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def _attnbench_cmd(args) -> str:
    return shlex.join([sys.executable, "-m", "attnbench", *map(str, args)])


def in_read_only(folder: Path, *args, timeout=300, code: str | None = None) -> subprocess.CompletedProcess:
    """``attnbench ARGS`` (or, with ``code``, ``python -c CODE``) with ``folder`` read-only for it (and only for
    it)."""
    argv = ["-c", code] if code is not None else ["-m", "attnbench", *map(str, args)]
    if not ROOT:
        modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
        try:
            for p in modes:
                p.chmod(0o555 if p.is_dir() else 0o444)
            return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env(),
                                  timeout=timeout)
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    if not can_mount():
        pytest.skip("root without CAP_SYS_ADMIN: no way to make a folder read-only for root here")
    f = shlex.quote(str(folder))
    script = f"mount --bind {f} {f} && mount -o remount,bind,ro {f} {f} && exec {shlex.join([sys.executable, *argv])}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env(),
                          timeout=timeout)


FULL_LISTING = "---listing---"


def on_full_disk(folder: Path, *args, free_kib: int = 0, timeout=300) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``attnbench ARGS`` with ``folder`` a file system of 64 KiB that has ``free_kib`` KiB left (the rest is
    the file ``filler``); returns the result and the names the folder held after it (the file system is gone
    once the command ends)."""
    if not can_mount():
        pytest.skip("no tmpfs to fill here (needs root with CAP_SYS_ADMIN)")
    f = shlex.quote(str(folder))
    script = (f"mount -t tmpfs -o size=64k tmpfs {f} && "
              f"(dd if=/dev/zero of={f}/filler bs=1024 count={64 - free_kib} 2>/dev/null; true) && "
              f"{_attnbench_cmd(args)}; rc=$?; echo {FULL_LISTING} >&2; ls -A {f} >&2; exit $rc")
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env(),
                         timeout=timeout)
    err, _, listing = res.stderr.partition(FULL_LISTING + "\n")
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout, err), listing.split()


_SMALL_DISK = """
import json, os, subprocess, sys
folder, kib, steps = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", folder], check=True)
out = []
for step in steps:
    if step[0] == "grow":
        subprocess.run(["mount", "-o", f"remount,size={step[1]}k", folder], check=True)
        continue
    res = subprocess.run([sys.executable, "-m", "attnbench", *step], capture_output=True, text=True)
    out.append({"rc": res.returncode, "out": res.stdout, "err": res.stderr, "names": sorted(os.listdir(folder))})
print(json.dumps(out))
"""


def on_small_disk(folder: Path, kib: int, *steps) -> list[subprocess.CompletedProcess]:
    """Each step ``attnbench ARGS`` (a list) in turn, or ``("grow", KIB)`` to give the file system more room,
    with ``folder`` a file system of ``kib`` KiB of its own (gone once the steps end); per command its result,
    whose ``names`` are what the folder held after it."""
    if not can_mount():
        pytest.skip("no tmpfs of its own here (needs root with CAP_SYS_ADMIN)")
    steps_json = json.dumps([[str(a) for a in step] for step in steps])
    res = subprocess.run(["unshare", "-m", sys.executable, "-c", _SMALL_DISK, str(folder), str(kib), steps_json],
                         capture_output=True, text=True, env=env(), timeout=600)
    assert res.returncode == 0, res.stderr
    out = []
    for item in json.loads(res.stdout):
        done = subprocess.CompletedProcess([], item["rc"], item["out"], item["err"])
        done.names = item["names"]
        out.append(done)
    return out

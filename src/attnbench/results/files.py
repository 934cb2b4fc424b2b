"""The user's files: what attnbench writes replaces a file whole or not at all and never lands on a
database; what it reads is bounded by size before it is parsed.

- ``check_output``: an output path (``-o``, ``--output``) that is a SQLite database (a results store or
  any other program's), a store's side file (``-wal``, ``-shm``, ``-journal``), the store the command
  writes, a folder, a read-only file, or a path in a folder (or file system) this process cannot write is
  refused before any work starts.
- ``write_atomic``: the new content goes to a temporary file beside the target, is flushed to disk and
  then renamed over it (``os.replace``), so a failure or a kill part-way leaves the old file as it was.
  An existing file keeps its permission bits; a symbolic link keeps pointing where it did and its target
  is replaced; a device or a pipe (``-o /dev/stdout``) is written to directly. A write that fails all the same
  (a full disk) is one line (FileRefused) naming the file and why.
- ``read_text``: a file given as input is refused, with its size and the limit, when it is larger than
  its kind of file ever needs to be (a config, a links file, a CSV of measurements, a profiler's trace), or
  when it is not a regular file (a device such as ``/dev/zero`` never ends; a pipe without a writer never
  answers): it is opened without waiting, looked at through the open file, and read no further than the
  limit, so a file that grows or is swapped meanwhile is refused all the same.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from attnbench.results import scratch

SQLITE_MAGIC = b"SQLite format 3\x00"
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside a database ``X``: ``X-wal``, ``X-shm``, ``X-journal``."""

MIB = 2**20
MAX_CONFIG_BYTES = 1 * MIB
"""A YAML config names options: a few hundred bytes in practice; a megabyte is thousands of values."""
MAX_LINKS_BYTES = 16 * MIB
"""An `attnbench links --output` file: about 30 KB for 11 sizes x 3 transfers."""
MAX_TABLE_BYTES = 256 * MIB
"""A CSV of measurements (cp-model's --kernels/--fit/--check): a whole store's export is a few MB."""
MAX_TRACE_BYTES = 2048 * MIB
"""A profiler's exported table (nsys / rocprof CSV) is read whole into memory: 2 GiB is tens of millions of kernels."""


class FileRefused(ValueError):
    """A path attnbench will not write to or read (a one-line answer for the user)."""


def is_sqlite(path: Path) -> bool:
    """Does ``path`` hold a SQLite database (by its first 16 bytes)?"""
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def store_of_side_file(path: Path) -> Path | None:
    """The database ``path`` is a side file of (``X-wal`` -> ``X``) when that database exists, else None."""
    for suffix in SIDE_SUFFIXES:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            owner = path.with_name(path.name[: -len(suffix)])
            if owner.is_file():
                return owner
    return None


def _same(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: Path, flag: str, *, stores: tuple[Path, ...] = ()) -> Path:
    """``path`` if attnbench may write a file there; FileRefused naming why not. ``stores`` are the results
    files the same command writes (an output must not be one of them, nor one of their side files)."""
    shown = f"{flag} {str(path)!r}"
    if path.is_dir():
        raise FileRefused(f"bad {shown}: it is a folder; give a file name")
    for store in stores:
        if _same(path, store) or any(_same(path, store.with_name(store.name + s)) for s in SIDE_SUFFIXES):
            raise FileRefused(f"bad {shown}: it is the results store this command writes (--db); give another file")
    if path.exists() and not path.is_file():
        return path  # a device or a pipe (-o /dev/stdout): written through, nothing there to lose
    if is_sqlite(path):
        raise FileRefused(f"bad {shown}: it is a SQLite database (a results store?); attnbench does not write "
                          "over it: give another file name")
    owner = store_of_side_file(path)
    if owner is not None:
        raise FileRefused(f"bad {shown}: it is a side file of the database {str(owner)!r}, which would lose "
                          "what is in it; give another file name")
    target = Path(os.path.realpath(path))  # written through a symbolic link, as write_atomic does
    folder = target.parent
    while not folder.exists() and folder != folder.parent:  # write_atomic makes the missing folders
        folder = folder.parent
    if not folder.is_dir():
        raise FileRefused(f"bad {shown}: {str(folder)!r} is a file, not a folder; give a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FileRefused(f"bad {shown}: its folder {str(folder)!r} is not writable{_read_only_fs(folder)}; give "
                          "a file in a folder you can write")
    if target.is_file() and not os.access(target, os.W_OK):
        raise FileRefused(f"bad {shown}: the file is read-only; give another file name (or make it writable)")
    return path


def _read_only_fs(folder: Path) -> str:
    try:
        return " (a read-only file system)" if os.statvfs(folder).f_flag & os.ST_RDONLY else ""
    except (OSError, AttributeError):
        return ""


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, flush it to disk and rename it over
    ``path``: readers see the old file or the new one, never a part. ``path`` is checked first
    (``check_output``); a failure removes the temporary file and leaves ``path`` as it was, and one that the
    system reports (a full disk, a file system made read-only meanwhile) is FileRefused naming it."""
    check_output(path, "output")
    existed = path.exists()
    try:
        _write_atomic(path, write)
    except OSError as exc:
        raise FileRefused(f"cannot write {path}: {exc.strerror or exc}; "
                          f"{'it is as it was' if existed else 'nothing was written'}") from None


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    if path.exists() and not path.is_file():
        write(path)  # a device or a pipe (/dev/stdout): nothing to replace
        return
    target = Path(os.path.realpath(path))  # write through a symbolic link, as open() would
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    tmp = scratch.temp_path(target)  # and the stale ones of killed processes beside it go
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if target.exists():
            shutil.copymode(target, tmp)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in made:  # the folders made for it, deepest first, when nothing else is in them
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    fsync_folder(target.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _too_big(path, size: int, limit: int, what: str) -> FileRefused:
    return FileRefused(f"{what} {path}: {size / MIB:,.1f} MiB, more than such a file ever needs "
                       f"({_limit_text(limit)} at most); is it the right file?")


def _limit_text(limit: int) -> str:
    return f"{limit / MIB:,.0f} MiB" if limit >= MIB else f"{limit / 1024:,.0f} KiB"


def read_text(path: Path, limit: int, what: str) -> str:
    """The text of ``path``, refused (FileRefused) when it is larger than ``limit`` bytes or not a regular
    file, before anything is read (see the module doc)."""
    try:
        info = os.stat(path)  # a pipe or a device is refused without opening it
    except OSError as exc:
        raise FileRefused(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(f"{what} {path}: not a regular file ({_kind(info.st_mode)}); give a file")
    if info.st_size > limit:
        raise _too_big(path, info.st_size, limit, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise FileRefused(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)  # what was opened, which may not be what was looked at
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{what} {path}: not a regular file ({_kind(info.st_mode)}); give a file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 16 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileRefused(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > limit:  # it grew while it was read
        raise _too_big(path, size, limit, what)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused(f"{what} {path}: not UTF-8 text; expected a text file") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # newlines as open() reads them in text mode


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"

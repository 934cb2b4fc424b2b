"""`attnbench repair`: keep the first record of each case of a run in a store that holds more (written by
attnbench versions before the store itself forbade duplicates).

Nothing is changed until everything that would make repair refuse has been checked, and the original is
never edited in place:

1. checks, on a connection that only reads and makes no file beside the store (``connect_to_read``): a
   regular SQLite file attnbench may write (file and folder), an attnbench store of a schema this version
   knows, ``PRAGMA quick_check`` of every page (repair does not mend damage), and no run of it still being
   written by a live process on this host;
2. a copy is made beside it with SQLite's backup API (which reads through the write-ahead log), the
   duplicates are deleted in the copy, the copy is migrated to the current schema and checked again
   (``quick_check``, one record per case, the expected number of records);
3. under an exclusive lock on the original (refused while any other process holds it open, or when it
   changed since the copy), its write-ahead log is folded into it (same content) so that no stale log can
   be replayed onto the copy, and the copy is renamed over it (``os.replace``, atomic), keeping its
   permission bits.

Any refusal or failure leaves the original as it was and removes the copy.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from attnbench.results import files, scratch
from attnbench.results.integrity import file_stamp, integrity_problem
from attnbench.results.record import SCHEMA_VERSION
from attnbench.results.scratch import process_alive
from attnbench.results.store import ResultStore, StoreError, check_layout, connect_to_read, duplicate_cases

DUPLICATES = "DELETE FROM records WHERE id NOT IN (SELECT MIN(id) FROM records GROUP BY run_id, case_id)"
"""Every record of a (run, case) but the first written."""


@dataclass(frozen=True)
class Repaired:
    """What repair did to a store."""

    path: Path
    removed: int
    """Records deleted (0: the file was not touched)."""
    kept: int
    """Records left."""


def _connect(path: Path) -> sqlite3.Connection:
    """A connection that reads the store and, when repair changes nothing, leaves nothing beside it
    (``connect_to_read``); a log without its index is read read-only (which makes the index: repair is about
    to rewrite the store, and every refusal before leaves its content as it was)."""
    try:
        return connect_to_read(path)
    except sqlite3.OperationalError:
        return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=30.0)


def _check(path: Path) -> tuple[int, int]:
    """(records repair would delete, records) of the store at ``path``; StoreError for anything it refuses."""
    if not path.is_file():
        raise StoreError(f"no results database at {path}" if not path.exists() else
                         f"{path} is not a regular file; give a results .db file")
    if not files.is_sqlite(path):
        raise StoreError(f"{path} is not a SQLite database; give an attnbench .db file")
    if not os.access(path, os.W_OK):
        raise StoreError(f"{path} is read-only; repair rewrites it: make it writable or repair a copy")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StoreError(f"{path}: its folder is not writable; repair writes the repaired copy beside the file "
                         "and swaps it in")
    conn = _connect(path)
    try:
        check_layout(conn, path)  # another program's database, a newer schema, ...
        problem = integrity_problem(conn, path.stat().st_size, full=True)
        if problem:
            raise StoreError(f"{path} is damaged (SQLite: {problem}); repair removes duplicate records only, it "
                             "does not mend a damaged file: keep a copy and read what is left with export")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "runs" in tables and {"host", "pid"} <= {r[1] for r in conn.execute("PRAGMA table_info(runs)")}:
            for run_id, pid, started in conn.execute("SELECT run_id, pid, pid_started FROM runs WHERE "
                                                     "status='running' AND host=? AND pid IS NOT NULL",
                                                     (socket.gethostname(),)):
                if process_alive(pid, started):
                    raise StoreError(f"{path}: run {run_id} is being written by pid {pid}; repair when it has ended")
        if "case_id" not in {r[1] for r in conn.execute("PRAGMA table_info(records)")}:
            return 0, 0
        records = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        extra = conn.execute(DUPLICATES.replace("DELETE", "SELECT COUNT(*)")).fetchone()[0]
        return extra, records
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} cannot be read as a results store ({exc}); the file is unchanged") from None
    finally:
        conn.close()


def _side_files(path: Path) -> list[Path]:
    return [p for p in (path.with_name(path.name + s) for s in files.SIDE_SUFFIXES) if p.exists()]


def _build_copy(path: Path, tmp: Path, expected: int) -> None:
    """The repaired store in ``tmp``: a copy of ``path`` without duplicates, at the current schema, checked."""
    source = _connect(path)
    copy = sqlite3.connect(tmp)
    try:
        source.backup(copy)
        with copy:
            copy.execute(DUPLICATES)
    finally:
        source.close()
        copy.close()
    ResultStore(tmp).close()  # migrates the copy to the current schema (one record per case, enforced)
    check = sqlite3.connect(tmp)
    try:
        problem = integrity_problem(check, tmp.stat().st_size, full=True)
        records = check.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        version = check.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        if problem or duplicate_cases(check) or records != expected or int(version) != SCHEMA_VERSION:
            raise StoreError(f"{path}: the repaired copy did not check out ({problem or f'{records} records'}, "
                             f"expected {expected}); the original is unchanged")
    finally:
        check.close()


def _fold_log(path: Path, copied: tuple) -> None:
    """Fold the original's write-ahead log into it (same content) and close it, so that no stale log is left
    to be replayed onto the copy once the copy takes its name. The exclusive lock taken first fails while
    any other process holds the file open, and the file's state is compared with the one copied (``copied``):
    either refusal comes before anything is changed."""
    conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # held until close: nobody reads or writes meanwhile
        try:
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError:
            raise StoreError(f"{path} is open elsewhere (another process: a run, a report, an export?); repair "
                             "it when that is done; the original is unchanged") from None
        if file_stamp(path) != copied:
            raise StoreError(f"{path} was written while it was being repaired; repair it again when nothing "
                             "writes to it; the original is unchanged")
        conn.execute("ROLLBACK")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()  # the last connection: SQLite checkpoints and deletes the log
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size:
        raise StoreError(f"{path}: its write-ahead log could not be folded in; the original is unchanged "
                         "(its content); repair again when no other process has it open")


def repair(path: str | Path) -> Repaired:
    """Keep the first record (lowest id) of each (run, case) of the store at ``path``; see the module doc."""
    path = Path(os.path.realpath(path))
    extra, records = _check(path)
    if not extra:
        return Repaired(path, 0, records)
    tmp = scratch.temp_path(path)  # and the stale ones of killed processes beside it go
    try:
        for p in (tmp, *_side_files(tmp)):
            p.unlink(missing_ok=True)
        copied = file_stamp(path)
        _build_copy(path, tmp, records - extra)
        _fold_log(path, copied)
        shutil.copymode(path, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        files.fsync_folder(path.parent)
    finally:
        for p in (tmp, *_side_files(tmp)):
            p.unlink(missing_ok=True)
    return Repaired(path, extra, records - extra)

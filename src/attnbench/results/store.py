"""SQLite results store: runs, environments and records, one transaction per record.

WAL mode lets readers (report, export) work while a run writes. Each process writes its own file;
several processes never write one file (sharded sweeps merge afterwards).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import sqlite3
import time
import uuid
from pathlib import Path

from attnbench.results import files, scratch
from attnbench.results.integrity import REQUIRED_TABLES, file_stamp, foreign_tables, integrity_problem
from attnbench.results.record import ABANDONED, COLUMNS, SCHEMA_VERSION, Record
from attnbench.results.scratch import process_alive, process_started

DEFAULT_DB = Path("attnbench-results") / "attnbench.db"

# Peaks measured by `attnbench calibrate` (matmul TFLOP/s, copy GB/s) per device and environment.
_PEAKS = """CREATE TABLE IF NOT EXISTS peaks (
    device_name TEXT NOT NULL, env_id TEXT NOT NULL, kind TEXT NOT NULL, value REAL NOT NULL,
    unit TEXT NOT NULL, measured_at REAL NOT NULL, details TEXT,
    PRIMARY KEY (device_name, env_id, kind))"""
_RECORDS_COLUMNS = ", ".join(f'"{name}" {kind}' for name, kind in COLUMNS.items())
_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE IF NOT EXISTS envs (env_id TEXT PRIMARY KEY, data TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, created_at REAL, finished_at REAL, status TEXT, command TEXT,
        config TEXT, env_id TEXT, attnbench_version TEXT, host TEXT, pid INTEGER, pid_started TEXT,
        cases INTEGER)""",
    f"CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, {_RECORDS_COLUMNS})",
    "CREATE UNIQUE INDEX IF NOT EXISTS records_case ON records (run_id, case_id)",
    _PEAKS,
]
"""The current schema (version ``SCHEMA_VERSION``), one statement each."""


# ---- migrations ---------------------------------------------------------------------------------
def _v0_to_v1(conn: sqlite3.Connection) -> None:
    """v0 = the layout before versioning: no meta table, records possibly missing later columns."""
    for statement in _SCHEMA:
        if "UNIQUE INDEX" not in statement:  # v4's, added by its migration
            conn.execute(statement)
    have = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    for name, kind in COLUMNS.items():
        if name not in have:  # ADD COLUMN cannot add NOT NULL without a default; old rows hold NULL
            conn.execute(f'ALTER TABLE records ADD COLUMN "{name}" {kind.replace(" NOT NULL", "")}')


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    """v2 adds the ``peaks`` table (additive: v1 records stay as they were)."""
    conn.execute(_PEAKS)


_RUNS = _SCHEMA[2]


def _v2_to_v3(conn: sqlite3.Connection) -> None:
    """v3 records which process runs a run (host, pid, its start time), so a killed one can be told apart."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if not have:  # files written by hand or by tools that kept only records
        conn.execute(_RUNS)
        return
    for name, kind in (("host", "TEXT"), ("pid", "INTEGER"), ("pid_started", "TEXT")):
        if name not in have:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


ADD_ENV = "INSERT OR IGNORE INTO envs VALUES (?, ?)"
"""An environment (id, JSON) added once."""


def duplicate_cases(conn: sqlite3.Connection) -> int:
    """How many (run, case) pairs hold more than one record."""
    return conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM records GROUP BY run_id, case_id "
                        "HAVING COUNT(*) > 1)").fetchone()[0]


def _insert(conn: sqlite3.Connection, record: Record, verb: str = "INSERT") -> int:
    """Insert ``record``'s row; the rows inserted (0 when ``verb`` is INSERT OR IGNORE and the case has one)."""
    row = record.to_row()
    names = list(COLUMNS)
    return conn.execute(f"{verb} INTO records ({', '.join(chr(34) + n + chr(34) for n in names)}) "
                        f"VALUES ({', '.join('?' * len(names))})", [row[n] for n in names]).rowcount


def record_stop(path: Path, run_id: str, abandoned: Record | None = None) -> bool:
    """Mark run ``run_id`` interrupted and store ``abandoned``, the record of the case in flight when it was stopped,
    unless the case's own record was stored meanwhile (False then), on a connection of its own: a stop watcher's
    thread cannot use the run's (SQLite connections stay in their thread). Waits at most 2 s for a writer."""
    conn = sqlite3.connect(path, timeout=2.0)
    try:
        with conn:
            stored = abandoned is not None and _insert(conn, abandoned, "INSERT OR IGNORE") == 1
            conn.execute("UPDATE runs SET finished_at=?, status='interrupted' WHERE run_id=?", (time.time(), run_id))
    finally:
        conn.close()
    return stored


class StoreError(Exception):
    """A store this process cannot use as asked (a one-line answer for the user)."""


def damaged(path: Path, problem: str) -> str:
    """The one line for a store SQLite finds damaged, for writers and readers alike."""
    return f"{path} is damaged (SQLite: {problem}); attnbench leaves it as it is: give another --db"


LOW_SPACE_BYTES = files.MIB
"""Free space below which a failed write is put down to a full disk (SQLite may call it an I/O error)."""


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged process may still write on the file system of ``folder`` (or of its nearest
    existing parent); None: unknown."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def no_space(path: Path, detail: str) -> str:
    """The one line for a store that could not be written for want of space."""
    free = free_bytes(path.parent)
    left = f"; {free / 1024:,.0f} KiB free there" if free is not None else ""
    return f"{path}: no space left on its file system ({detail}{left}); free some space or give another --db"


def disk_full(exc: BaseException, path: Path) -> bool:
    """Did a write to the store at ``path`` fail for want of space? SQLite says 'database or disk is full'
    (SQLITE_FULL), or 'disk I/O error' where the file system left it short (then less than LOW_SPACE_BYTES
    are free there); Python's own writes say ENOSPC or EDQUOT."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    text = str(exc)
    if "disk is full" in text or getattr(exc, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        return True
    if "disk I/O error" in text:
        free = free_bytes(path.parent)
        return free is not None and free < LOW_SPACE_BYTES
    return False


class StoreFull(StoreError):
    """The file system of a store filled up while a command wrote to it. SQLite undid the write that failed;
    everything committed before it (``stored`` records of ``run_id``, None: unknown) stays in the store,
    readable. A StoreError (one line, exit status 2, as a full disk met when a store is made); a command that
    knows more (how far a run got, how to go on) says it in a line of its own from these fields."""

    def __init__(self, path: Path, detail: str, run_id: str | None = None, stored: int | None = None):
        self.path, self.detail, self.run_id, self.stored = path, detail, run_id, stored
        free = free_bytes(path.parent)
        self.free = f"; {free / 1024:,.0f} KiB free there" if free is not None else ""
        if run_id is None or stored is None:
            kept = "; what was written before stays readable"
        elif stored == 0:
            kept = f"; no record of run {run_id} was stored"
        else:
            kept = (f"; the {stored} record{'s' * (stored != 1)} of run {run_id} written before "
                    f"{'stay' if stored != 1 else 'stays'} readable")
        super().__init__(f"the disk is full: {path} could not be written ({detail}{self.free}){kept}; free some "
                         "space and run the command again")


def _describe(path: Path, exc: sqlite3.DatabaseError) -> str:
    """One line for an SQLite error met while opening a store."""
    text = str(exc)
    if "disk is full" in text:
        return no_space(path, f"SQLite: {text}")
    if "disk I/O error" in text:
        free = free_bytes(path.parent)
        if free is not None and free < LOW_SPACE_BYTES:
            return no_space(path, f"SQLite: {text}")
        return f"{path}: reading or writing it failed (SQLite: {text}); check the disk it lies on"
    if "readonly" in text or "read-only" in text:
        return f"{path} is read-only; a run needs a store it can write (give another --db)"
    if "locked" in text:
        return f"{path} is locked by another process for too long ({text}); try again when it is done"
    if "unable to open" in text:
        return f"{path} cannot be opened ({text}); check its folder's permissions"
    return f"{path} is damaged or not a database ({text}); attnbench leaves it alone: give another --db"


class DuplicateRecords(StoreError):
    """A store holds several records of one case of one run (written before the store forbade it)."""


def _v3_to_v4(conn: sqlite3.Connection) -> None:
    """v4: one record per (run, case), enforced by a unique index. A store that already holds duplicates
    (concurrent writers or resumes of older versions) is not changed silently: ``repair`` first."""
    conn.execute(_SCHEMA[3])  # files written by hand or by tools that kept only runs
    found = duplicate_cases(conn)
    if found:
        raise DuplicateRecords(f"{found} case{'s' * (found != 1)} of a run hold more than one record; "
                               "`attnbench repair --db FILE` keeps the first record of each")
    conn.execute("DROP INDEX IF EXISTS records_run")
    conn.execute(_SCHEMA[4])


def _v4_to_v5(conn: sqlite3.Connection) -> None:
    """v5 adds ``runs.cases``, the cases a run set out to run (NULL for runs stored before, and for commands that
    do not plan cases ahead): an interrupted run then reads "1 of 12 cases ran", not "1 of 1"."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if not have:
        conn.execute(_RUNS)
    elif "cases" not in have:
        conn.execute("ALTER TABLE runs ADD COLUMN cases INTEGER")


MIGRATIONS: list = [_v0_to_v1, _v1_to_v2, _v2_to_v3, _v3_to_v4, _v4_to_v5]
"""``MIGRATIONS[n]`` upgrades a database from schema version n to n + 1 (one transaction each).

To change the schema: bump ``SCHEMA_VERSION`` (results/record.py), update ``_SCHEMA`` to the new
layout and append a function doing the same to an existing database of the previous version."""


def _link_new(tmp: Path, path: Path) -> None:
    """Put the new store ``tmp`` in place at ``path`` unless a store is there already (another process made it
    meanwhile: that one is used)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return
    except OSError as exc:  # a file system without hard links
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if not path.exists():
            os.replace(tmp, path)


def schema_version(conn: sqlite3.Connection) -> int | None:
    """Version of the open database: None when empty, 0 when it predates versioning."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" in tables:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None:
            return int(row[0])
    return 0 if tables & {"records", "runs"} else None

class RunClaimed(StoreError):
    """A run id that this process may not write to (it exists, or another live process writes it)."""


class RunFinished(RunClaimed):
    """A resume of a run that finished: every case has its record, and the run is left as it is."""


_CHECKED: set[tuple] = set()
"""``file_stamp`` of the stores found sound in this process (a store is checked once per state)."""
def check_layout(conn: sqlite3.Connection, path: Path) -> int | None:
    """The schema version of the open database (None: empty), or StoreError when it is not an attnbench store
    this version can use: another program's database, a schema version that is not a number or is newer,
    the current version with tables missing."""
    foreign = foreign_tables(conn)
    if foreign and set(foreign) & REQUIRED_TABLES:  # a store whose damage hides what it is (its meta index, say)
        problem = integrity_problem(conn, path.stat().st_size)
        if problem:
            raise StoreError(damaged(path, problem))
    if foreign:
        shown = ", ".join(foreign[:5]) + (", …" if len(foreign) > 5 else "")
        raise StoreError(f"{path} is a SQLite database of something else (tables: {shown}); "
                         "attnbench leaves it alone: give another --db")
    try:
        found = schema_version(conn)
    except ValueError:
        raise StoreError(f"{path}: its schema version is not a number; not an attnbench store "
                         "this version can read") from None
    if found is not None and found > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {found}; this attnbench reads up to "
                         f"{SCHEMA_VERSION}: upgrade attnbench")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = ", ".join(sorted(REQUIRED_TABLES - tables))
    if found == SCHEMA_VERSION and missing:
        raise StoreError(f"{path} says schema version {found} but lacks table(s) {missing}: damaged; "
                         "attnbench leaves it alone")
    return found


MAX_RUN_ID = 64
RUN_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-+")
RESERVED_RUN_IDS = ("latest",)
"""Words the views read as something else (``--run latest`` = the newest run)."""


class BadRunId(ValueError):
    """A run id that may not name a run (``check_run_id``): bad input, one line."""


def check_run_id(run_id: str, what: str = "--run-id") -> str:
    """``run_id`` if it may name a run, else BadRunId: 1..64 of letters, digits, ``. _ - +``, not starting with
    ``.`` or ``-`` (it names plot folders and files, so no path separators, no ``..``), not a reserved word.

    The one check of every id, wherever it comes from (``what`` says where, for the message): the command line,
    the Python API, ``--resume``, a store merged in, a stored id read back to name a file, and a new run's claim
    (``ResultStore.start_run``)."""
    rule = f"use 1 to {MAX_RUN_ID} letters, digits, '.', '_', '-' or '+'"
    if not isinstance(run_id, str):
        raise BadRunId(f"bad {what} {run_id!r:.80}: it is a {type(run_id).__name__}, not text; {rule}")
    shown = f"{run_id!r:.80}"
    if not run_id or len(run_id) > MAX_RUN_ID:
        raise BadRunId(f"bad {what} {shown}: it has {len(run_id)} characters; {rule}")
    bad = sorted(set(run_id) - RUN_ID_CHARS)
    if bad:
        raise BadRunId(f"bad {what} {shown}: it holds {''.join(bad)[:10]!r}; {rule}")
    if run_id[0] in ".-" or ".." in run_id:
        raise BadRunId(f"bad {what} {shown}: it may not start with '.' or '-' nor hold '..'; {rule}")
    if run_id.lower() in RESERVED_RUN_IDS:
        raise BadRunId(f"bad {what} {shown}: {run_id!r} is reserved (--run latest means the newest run); use "
                       "another id")
    return run_id


def new_run_id() -> str:
    """Sortable, unique run id: UTC time plus a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def connect_to_read(path: Path) -> sqlite3.Connection:
    """A connection that reads the store at ``path`` and leaves its folder as it was. A read-only connection to
    a WAL store makes a -wal and a -shm file beside it where there are none (a store nobody has open), and
    cannot remove them when it closes: they stayed beside the store after every report, export or listing. So:

    - with a writer's -wal and -shm there (a run writing now, or one killed), a read-only connection, which
      shares them and makes nothing;
    - with no side file (nobody has the store open), in a folder and a file this process may write, a
      connection that may write but is held to reading (``PRAGMA query_only``): the last connection to close
      removes the side files SQLite made while it read, and with nothing written nothing else changes;
    - otherwise (a file or folder this process cannot write, a write-ahead log without its index: copied or
      unpacked from a killed run) OperationalError: ``ResultStore`` then reads it as immutable or from a
      private copy (``_read_log``). A rollback journal left by another program is read as before, read-only.
    """
    uri = path.resolve().as_uri()
    side = {s for s in files.SIDE_SUFFIXES if path.with_name(path.name + s).exists()}
    if side == {"-wal", "-shm"} or "-journal" in side:
        return sqlite3.connect(uri + "?mode=ro", uri=True, timeout=30.0)
    if side or not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)):
        raise sqlite3.OperationalError("no way to read it in place without making a file beside it")
    conn = sqlite3.connect(uri + "?mode=rw", uri=True, timeout=30.0)
    conn.execute("PRAGMA query_only=ON")
    return conn


class ResultStore:
    """Open (creating if needed) a results database at ``path``.

    ``readonly=True`` is for readers (report, export, compare, merge inputs): the file is only read, never
    changed, and nothing is left beside it (``connect_to_read``); an older schema is migrated in a private
    in-memory copy. Writers create or migrate the file.
    A file that is not a usable attnbench store (damaged, foreign, newer, unreadable) raises StoreError before
    anything is written to it."""

    def __init__(self, path: str | Path = DEFAULT_DB, *, create: bool = True, readonly: bool = False,
                 verify: bool | None = None):
        self.path = Path(path)
        self.readonly = readonly
        self.verify = not readonly if verify is None else verify
        """Check the file's integrity first (writers do; ``check_writable`` has a reader do it)."""
        self._private: Path | None = None
        """The folder of a private copy this reader reads (``_read_log``), removed on close."""
        if (readonly or not create) and not self.path.exists():
            raise FileNotFoundError(f"no results database at {self.path}")
        if self.path.exists() and not self.path.is_file():
            raise StoreError(f"{self.path} is not a regular file; give a results .db file")
        owner = files.store_of_side_file(self.path)
        if owner is not None and not readonly:
            raise StoreError(f"{self.path} is a side file SQLite keeps beside {owner}; give the database itself "
                             "(or another name)")
        if not self.path.exists():
            self._create()
        elif self.path.stat().st_size:
            if not files.is_sqlite(self.path):
                raise StoreError(f"{self.path} is not a SQLite database; give an attnbench .db file or a new path")
        self.conn = self._connect()
        self._dead: set[str] = set()
        try:
            found = self._check()
            if readonly and found != SCHEMA_VERSION:
                self.conn = self._in_memory_copy()
            if not readonly:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
            self._upgrade()
            self.mark_dead_runs()
            if not readonly:  # as it records dead runs, a writer removes what killed processes left beside it
                scratch.remove_stale(self.path.parent)
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreError(_describe(self.path, exc)) from None
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        """Make a new store at ``path`` (and its folder): the schema is written to a temporary file beside it,
        which is then linked into place whole and its temporary name removed. A failure part-way (a full disk)
        leaves neither a store nor a folder behind, and no process ever opens a store without its tables; where
        another process made the store first, its store is used."""
        made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        tmp = scratch.temp_path(self.path)  # and the stale ones of killed processes beside it go
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(tmp, timeout=30.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                conn.commit()
            finally:
                conn.close()  # moves the log into the file (a checkpoint), and removes the log
            log = tmp.with_name(tmp.name + "-wal")
            if log.exists() and log.stat().st_size:  # the checkpoint failed (SQLite does not say so on close)
                raise sqlite3.OperationalError("disk I/O error")
            _link_new(tmp, self.path)
            tmp.unlink(missing_ok=True)  # the store is in place under its name: the second link goes
            files.fsync_folder(self.path.parent)
        except BaseException as exc:
            for p in (tmp, *(tmp.with_name(tmp.name + s) for s in files.SIDE_SUFFIXES)):
                # on a read-only file system even a name that is not there fails to go (EROFS, not ENOENT): the
                # failure that brought us here is the one to tell
                with contextlib.suppress(OSError):
                    p.unlink(missing_ok=True)
            for folder in made:  # deepest first; only what this call made and left empty
                try:
                    folder.rmdir()
                except OSError:
                    break
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(_describe(self.path, exc)) from None
            if isinstance(exc, OSError):
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StoreError(no_space(self.path, exc.strerror or str(exc))) from None
                raise StoreError(f"{self.path}: cannot create it ({exc.strerror or exc}); give another --db") from None
            raise

    def _connect(self) -> sqlite3.Connection:
        if not self.readonly:
            if self.path.exists() and not os.access(self.path, os.W_OK):
                raise StoreError(f"{self.path} is read-only; a run needs a store it can write (give another --db)")
            conn = sqlite3.connect(self.path, timeout=30.0)
        else:
            conn = None
            try:
                conn = connect_to_read(self.path)
                conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError:
                # a WAL store in a folder this process cannot write (no -shm file to share), or only part of a
                # writer's side files beside it: nobody can be writing it
                if conn is not None:
                    conn.close()
                conn = self._read_log()
            except sqlite3.DatabaseError as exc:
                if conn is not None:
                    conn.close()
                raise StoreError(_describe(self.path, exc)) from None
        conn.row_factory = sqlite3.Row
        return conn

    def _read_log(self) -> sqlite3.Connection:
        """The store, for a reader SQLite cannot share it with without making files beside it (a WAL store in a
        folder this process cannot write: SQLite needs to make its -shm index there; a log without its index).
        Without a write-ahead log, the file read as an immutable one; with one, whose committed records are not
        in the file yet, a private copy of both, in a temporary folder, where SQLite reads the log: every
        committed record, and the user's files untouched. StoreError naming what to do where no copy can be
        made."""
        log = self.path.with_name(self.path.name + "-wal")
        if not log.is_file() or not log.stat().st_size:
            return sqlite3.connect(self.path.resolve().as_uri() + "?immutable=1", uri=True, timeout=30.0)
        folder = None
        try:
            folder = scratch.temp_dir("read")
            copy = folder / "store.db"
            shutil.copyfile(self.path, copy)
            shutil.copyfile(log, copy.with_name(copy.name + "-wal"))
            conn = sqlite3.connect(copy, timeout=30.0)
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # SQLite reads the log into its index
        except (OSError, sqlite3.DatabaseError) as exc:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            where = ("its folder is read-only" if not os.access(self.path.parent, os.W_OK | os.X_OK) else
                     "a reader does not make its index (-shm) there")
            raise StoreError(f"{self.path}: some of its records are still in its write-ahead log {log.name}, which "
                             f"SQLite reads only where it may write beside the store, and {where}; a "
                             f"private copy to read could not be made ({why}): copy {self.path.name} and {log.name} "
                             "to a folder you can write and read the copy") from None
        self._private = folder
        return conn

    def _drop_private(self) -> None:
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None

    def _check(self) -> int | None:
        """The file's schema version, or StoreError when it is not an attnbench store this version can use
        (``check_layout``; for a writer: nor one SQLite finds damaged, ``integrity_problem``)."""
        found = check_layout(self.conn, self.path)
        tables = {row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if self.verify and tables:
            self._check_integrity()
        if found is not None and found < 4 and "case_id" in {r[1] for r in self.conn.execute("PRAGMA table_info(records)")}:
            dup = duplicate_cases(self.conn)  # v4's migration would refuse them: say so before anything is written
            if dup:
                raise DuplicateRecords(f"{self.path}: {dup} case{'s' * (dup != 1)} of a run hold more than one "
                                       "record; `attnbench repair --db FILE` keeps the first record of each")
        return found

    def _check_integrity(self) -> None:
        """Refuse to write to a store SQLite finds damaged (once per state of the file in a process)."""
        stamp = file_stamp(self.path)
        if stamp in _CHECKED:
            return
        problem = integrity_problem(self.conn, self.path.stat().st_size)
        if problem:
            raise StoreError(damaged(self.path, problem))
        _CHECKED.add(stamp)

    @staticmethod
    def check_writable(path: str | Path) -> None:
        """StoreError for anything a writer of ``path`` would refuse (a read-only file or folder, a file that is
        not a usable store, a damaged one), found without creating or changing anything: commands call it
        before their work starts."""
        path = Path(path)
        owner = files.store_of_side_file(path)
        if owner is not None:
            raise StoreError(f"{path} is a side file SQLite keeps beside {owner}; give the database itself "
                             "(or another name)")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(f"{path}: its folder {folder} is not writable; this command writes the store "
                             "(give another --db)")
        if not path.exists() or not path.stat().st_size:
            return
        if path.is_file() and not os.access(path, os.W_OK):
            raise StoreError(f"{path} is read-only; this command writes the store (give another --db)")
        ResultStore(path, readonly=True, verify=True).close()

    def _in_memory_copy(self) -> sqlite3.Connection:
        """A private copy of an older (or empty) store, for a reader to migrate without touching the file."""
        memory = sqlite3.connect(":memory:")
        self.conn.backup(memory)
        self.conn.close()
        self._drop_private()
        memory.row_factory = sqlite3.Row
        return memory

    def _upgrade(self) -> None:
        """Create the schema, or migrate an older one step by step; readers of a current file write nothing."""
        while (found := schema_version(self.conn)) != SCHEMA_VERSION:
            self.conn.execute("BEGIN IMMEDIATE")  # take the write lock, then look again: another process may have
            try:
                found = schema_version(self.conn)
                if found is None:
                    for statement in _SCHEMA:
                        self.conn.execute(statement)
                    target = SCHEMA_VERSION
                elif found < SCHEMA_VERSION:
                    MIGRATIONS[found](self.conn)
                    target = found + 1
                else:
                    target = found
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(target),))
                self.conn.commit()
            except BaseException as exc:
                self.conn.rollback()
                if isinstance(exc, DuplicateRecords):
                    raise DuplicateRecords(f"{self.path}: {exc}") from None
                if found is None or found >= SCHEMA_VERSION or not isinstance(exc, Exception):
                    raise
                raise StoreError(f"{self.path}: migrating the schema from version {found} to {found + 1} failed "
                                 f"({type(exc).__name__}: {exc}); the database is unchanged") from exc

    def mark_dead_runs(self) -> list[str]:
        """Runs still 'running' whose process on this host is gone (killed: SIGKILL, OOM killer, power)
        become 'interrupted'; ``--resume`` completes them. Writes nothing when there are none."""
        host = socket.gethostname()
        rows = self.conn.execute("SELECT run_id, pid, pid_started FROM runs WHERE status='running' AND host=? "
                                 "AND pid IS NOT NULL", (host,)).fetchall()
        dead = [r["run_id"] for r in rows if not process_alive(r["pid"], r["pid_started"])]
        self._dead = set(dead)
        if dead and not self.readonly:
            try:
                with self.conn:
                    self.conn.executemany("UPDATE runs SET status='interrupted' WHERE run_id=? AND status='running'",
                                          [(run_id,) for run_id in dead])
            except sqlite3.OperationalError:  # a read-only file: say it, do not fail to open it
                return []
        return dead

    @property
    def schema_version(self) -> int:
        return schema_version(self.conn)

    def close(self) -> None:
        self.conn.close()
        self._drop_private()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writing --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _writing(self, run_id: str | None = None):
        """A write that fails for want of space (``disk_full``) is StoreFull, counting what ``run_id`` holds."""
        try:
            yield
        except (sqlite3.DatabaseError, OSError) as exc:
            if not disk_full(exc, self.path):
                raise
            detail = f"SQLite: {exc}" if isinstance(exc, sqlite3.DatabaseError) else exc.strerror or str(exc)
            raise StoreFull(self.path, detail, run_id, self._stored(run_id)) from None

    def _stored(self, run_id: str | None) -> int | None:
        """How many records of ``run_id`` the store holds (reading needs no space); None: unknown."""
        if run_id is None:
            return None
        try:
            return self.conn.execute("SELECT COUNT(*) FROM records WHERE run_id=?", (run_id,)).fetchone()[0]
        except sqlite3.DatabaseError:
            return None

    def add_env(self, env_id: str, data: dict) -> None:
        with self._writing(), self.conn:
            self.conn.execute(ADD_ENV, (env_id, json.dumps(data, sort_keys=True)))

    def start_run(self, run_id: str, *, command: str, config: dict, env_id: str | None, version: str,
                  resume: bool = False) -> None:
        """Claim ``run_id`` for this process, atomically: a new id is inserted; an existing one is taken only
        by a resume (``resume=True``) and only when the process that ran it is gone. Raises RunClaimed
        otherwise, so two processes never write one run; BadRunId for an id ``check_run_id`` refuses (views
        name files after it)."""
        check_run_id(run_id, "run id")
        with self._writing(run_id):
            self._claim(run_id, command, config, env_id, version, resume)

    def _claim(self, run_id: str, command: str, config: dict, env_id: str | None, version: str,
               resume: bool) -> None:
        pid, host = os.getpid(), socket.gethostname()
        self.conn.execute("BEGIN IMMEDIATE")  # the write lock before looking: the look and the claim are one step
        try:
            row = self.conn.execute("SELECT status, host, pid, pid_started FROM runs WHERE run_id=?",
                                    (run_id,)).fetchone()
            if row is not None and not resume:
                raise RunClaimed(f"run {run_id} already exists in {self.path}; choose another --run-id "
                                 f"(or --resume {run_id} to complete it)")
            if row is not None and row["status"] == "done":  # its end (time, process) stays as it was
                raise RunFinished(f"run {run_id} already finished: {self.path} holds a record of each of its cases; "
                                  "nothing to resume")
            if row is not None and row["status"] == "running" and row["pid"] is not None:
                if row["host"] != host:
                    raise RunClaimed(f"run {run_id} is marked running by pid {row['pid']} on {row['host']}; "
                                     "resume it there, or after that process is gone")
                if row["pid"] != pid and process_alive(row["pid"], row["pid_started"]):
                    raise RunClaimed(f"run {run_id} is still running (pid {row['pid']}); wait for it to end "
                                     f"or stop it, then --resume {run_id}")
            self.conn.execute(
                "INSERT INTO runs (run_id, created_at, finished_at, status, command, config, env_id, "
                "attnbench_version, host, pid, pid_started) VALUES (?, ?, NULL, 'running', ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(run_id) DO UPDATE "
                "SET status='running', finished_at=NULL, host=excluded.host, pid=excluded.pid, "
                "pid_started=excluded.pid_started",
                (run_id, time.time(), command, json.dumps(config, sort_keys=True), env_id, version,
                 host, pid, process_started(pid)))
            if resume:  # the cases a stop abandoned in flight run again
                self.conn.execute("DELETE FROM records WHERE run_id=? AND status='error' AND reason LIKE ?",
                                  (run_id, ABANDONED + "%"))
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise

    def plan_cases(self, run_id: str, cases: int) -> None:
        """Record that run ``run_id`` sets out to run ``cases`` cases in all (those of a resumed run's earlier
        attempts included), so the views can tell an interrupted run from a finished one."""
        with self._writing(run_id), self.conn:
            self.conn.execute("UPDATE runs SET cases=? WHERE run_id=?", (int(cases), run_id))

    def finish_run(self, run_id: str, status: str = "done") -> None:
        with self._writing(run_id), self.conn:
            self.conn.execute("UPDATE runs SET finished_at=?, status=? WHERE run_id=?", (time.time(), status, run_id))

    def write(self, record: Record) -> None:
        """Insert one record in its own transaction (durable before the next case starts). A second record
        of one case of one run is refused by the store (RunClaimed names the case); a full disk is StoreFull,
        the records before this one kept."""
        try:
            with self._writing(record.run_id), self.conn:
                _insert(self.conn, record)
        except sqlite3.IntegrityError as exc:
            raise RunClaimed(f"run {record.run_id} already has a record of {record.backend} {record.spec.label()} "
                             f"{record.spec.pass_}: another process writes this run") from exc

    def add_peak(self, device_name: str, env_id: str, kind: str, value: float, unit: str,
                 details: dict | None = None) -> None:
        """Store a measured peak (e.g. kind matmul_bf16 in TFLOP/s, copy in GB/s); replaces an older one."""
        with self._writing(), self.conn:
            self.conn.execute("INSERT OR REPLACE INTO peaks VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (device_name, env_id, kind, float(value), unit, time.time(),
                               json.dumps(details or {}, sort_keys=True)))

    # ---- reading --------------------------------------------------------------------------------
    def _run_row(self, row) -> dict:
        run = dict(row)
        if run["run_id"] in self._dead and run["status"] == "running":  # a reader does not write the change
            run["status"] = "interrupted"
        return run

    def runs(self) -> list[dict]:
        return [self._run_row(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY created_at")]

    def run(self, run_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return self._run_row(row) if row else None

    def latest_run_id(self) -> str | None:
        row = self.conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def env(self, env_id: str) -> dict | None:
        row = self.conn.execute("SELECT data FROM envs WHERE env_id=?", (env_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def rows(self, run_id: str | None = None, **where) -> list[dict]:
        """Record rows as dicts, optionally filtered by run and by column equality."""
        clauses, args = [], []
        if run_id is not None:
            clauses.append("run_id = ?")
            args.append(run_id)
        for col, value in where.items():
            if col not in COLUMNS:
                raise ValueError(f"unknown record column {col!r}")
            clauses.append(f'"{col}" = ?')
            args.append(value)
        sql = "SELECT * FROM records" + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY id"
        return [dict(r) for r in self.conn.execute(sql, args)]

    def records(self, run_id: str | None = None, **where) -> list[Record]:
        return [Record.from_row(r) for r in self.rows(run_id, **where)]

    def case_ids(self, run_id: str) -> set[str]:
        """Case ids that already have a record in ``run_id`` (used by --resume)."""
        return {r[0] for r in self.conn.execute("SELECT case_id FROM records WHERE run_id=?", (run_id,))}

    def peaks(self, device_name: str) -> dict[str, dict]:
        """Latest measured peak per kind for a device: {kind: {value, unit, env_id, measured_at, details}}."""
        rows = self.conn.execute("SELECT * FROM peaks WHERE device_name=? ORDER BY measured_at", (device_name,))
        out = {}
        for r in rows:
            out[r["kind"]] = {"value": r["value"], "unit": r["unit"], "env_id": r["env_id"],
                              "measured_at": r["measured_at"], "details": json.loads(r["details"] or "{}")}
        return out

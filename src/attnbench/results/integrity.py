"""Is a SQLite file an attnbench store, and is it sound? Checks made before a store is written
(``ResultStore``) or repaired (``repair.py``); they read, never write.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from attnbench.results import files

REQUIRED_TABLES = frozenset({"meta", "records", "runs", "envs"})
"""Tables a current store must hold (``peaks`` is made when first needed)."""
OWN_TABLES = REQUIRED_TABLES | {"peaks"}
V0_KEYS = {"records": {"run_id", "backend"}, "runs": {"run_id"}, "envs": {"env_id"}}
"""Columns an unversioned (v0) store's tables have: what tells it from another program's tables of those names."""


def foreign_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables of a database that is not an attnbench store (empty for a store or an empty database).

    A store is versioned (a ``meta`` table holding ``schema_version``; other tables a user added are
    tolerated), or older than versioning: only attnbench's own tables, each with its key columns. A
    ``meta``, ``runs`` or ``records`` table of another program is not taken for one."""
    tables = sorted(name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                    if not name.startswith("sqlite_"))
    if not tables:
        return []
    if "meta" in tables:
        try:
            versioned = conn.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is not None
        except sqlite3.OperationalError:  # a meta table without a key column
            versioned = False
        return [] if versioned else tables
    if set(tables) - OWN_TABLES or not set(tables) & {"records", "runs"}:
        return tables
    for table in tables:
        have = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        if not V0_KEYS.get(table, set()) <= have:
            return tables
    return []


FULL_CHECK_BYTES = 64 * files.MIB
"""Stores up to this size get SQLite's ``quick_check`` of every page before a writer uses them; bigger ones
only the parts a writer touches (``integrity_problem``). Measured on the 2-core CI VM: all of a 102 MiB store
in 0.08 s from the page cache and 1.7 s from a cold disk (so about 0.05 s and 1 s at 64 MiB); the partial
check of an 827 MiB store in 0.02 s from a cold disk, where all of it took 12 s."""


def file_stamp(path: Path) -> tuple:
    """What changes when a store is written: its size and time, and its write-ahead log's while that holds
    anything (a reader may create an empty log; that is no change)."""
    out: list = [os.path.realpath(path)]
    for p in (path, path.with_name(path.name + "-wal")):
        try:
            st = p.stat()
            out += [st.st_size, st.st_mtime_ns if st.st_size else None]
        except OSError:
            out += [0, None]
    return tuple(out)


def integrity_problem(conn: sqlite3.Connection, size: int, *, full: bool = False) -> str | None:
    """What SQLite finds wrong with the open database, or None. Up to ``FULL_CHECK_BYTES`` (or ``full``):
    ``PRAGMA quick_check`` (every page, b-tree structure, record formats; not index contents). Bigger:
    the file's length against its header, ``quick_check`` of every table but ``records``, all of the
    ``records_case`` index (where each new record is inserted) and the newest 100 records (the pages new
    records go to); damage among older records is found when they are read."""
    try:
        if full or size <= FULL_CHECK_BYTES:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
        else:
            pages, page_size = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "page_size"))
            if pages * page_size > size:
                return f"the header says {pages * page_size:,} bytes, the file holds {size:,} (truncated)"
            tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            rows = [r[0] for t in tables if t != "records" for r in conn.execute(f'PRAGMA quick_check("{t}")')]
            if "records" in tables:
                conn.execute("SELECT COUNT(*) FROM records").fetchone()  # the smallest index, whole
                conn.execute("SELECT * FROM records ORDER BY id DESC LIMIT 100").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    bad = [r for r in rows if r != "ok"]
    return "; ".join(" ".join(r.split()) for r in bad)[:300] or None



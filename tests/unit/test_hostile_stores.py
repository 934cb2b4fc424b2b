"""A damaged, foreign, newer or unreadable store is one line and exit 2, and is never changed; readers open
stores read-only."""

import hashlib
import os
import shutil
import sqlite3

import pytest
from reliability_helpers import TINY, attnbench

from attnbench.results.record import SCHEMA_VERSION
from attnbench.results.store import ResultStore, StoreError


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    db = tmp_path_factory.mktemp("store") / "good.db"
    res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", str(db), "--quiet")
    assert res.returncode == 0, res.stderr
    with sqlite3.connect(db) as conn:  # one self-contained file (no -wal beside it) to copy and damage
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    return db


def _copy(good, tmp_path, name, sql=None):
    path = tmp_path / name
    shutil.copy(good, path)
    if sql:
        with sqlite3.connect(path) as conn:
            conn.execute(sql)
        conn.close()
    return path


HOSTILE = {
    "newer": ("UPDATE meta SET value='99' WHERE key='schema_version'", "schema version 99.*upgrade attnbench"),
    "not-a-number": ("UPDATE meta SET value='abc' WHERE key='schema_version'", "schema version is not a number"),
    "partial": ("DROP TABLE records", "lacks table.*records.*damaged"),
}


@pytest.mark.parametrize("kind", [*HOSTILE, "truncated", "foreign", "text"])
def test_a_store_attnbench_cannot_use_is_refused_and_left_as_it_was(good, tmp_path, kind):
    if kind in HOSTILE:
        path, match = _copy(good, tmp_path, "s.db", HOSTILE[kind][0]), HOSTILE[kind][1]
    elif kind == "truncated":
        path, match = tmp_path / "s.db", "damaged or not a database"
        path.write_bytes(good.read_bytes()[:5000])
    elif kind == "foreign":
        path, match = tmp_path / "s.db", r"database of something else \(tables: photos\)"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE photos (x)")
        conn.close()
    else:
        path, match = tmp_path / "s.db", "not a SQLite database"
        path.write_text("hello\n")
    before = digest(path)
    for readonly in (True, False):
        with pytest.raises(StoreError, match=match):
            ResultStore(path, readonly=readonly)
    for args in (["export", "-o", str(tmp_path / "x.csv")], ["report", "-o", str(tmp_path / "r.html")],
                 ["runs"], ["run", *TINY, "--seq-lens", "17", "--backends", "naive"]):
        res = attnbench(*args, "--db", str(path))
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("attnbench: error:"), res.stderr
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s.db")) in (
        ["s.db"], ["s.db", "s.db-shm", "s.db-wal"])  # SQLite's side files at most, never a changed file


def test_readers_write_nothing_to_a_current_store(good, tmp_path):
    path = _copy(good, tmp_path, "s.db")
    before, stamp = digest(path), path.stat().st_mtime_ns
    with ResultStore(path, readonly=True) as store:
        assert store.records() and store.schema_version == SCHEMA_VERSION
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.conn.execute("DELETE FROM records")
    assert digest(path) == before and path.stat().st_mtime_ns == stamp


def test_a_reader_migrates_an_older_store_in_memory_only(good, tmp_path):
    path = _copy(good, tmp_path, "s.db", "DROP INDEX records_case")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    conn.close()
    before = digest(path)
    with ResultStore(path, readonly=True) as store:
        assert store.schema_version == SCHEMA_VERSION and len(store.records()) == 1
    assert digest(path) == before
    with ResultStore(path) as store:  # a writer upgrades the file itself
        assert store.schema_version == SCHEMA_VERSION
    assert digest(path) != before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only files anyway")
def test_read_only_file_and_folder(good, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = _copy(good, folder, "s.db")
    path.chmod(0o444)
    folder.chmod(0o555)
    try:
        res = attnbench("export", "--db", str(path), "-o", str(tmp_path / "x.csv"))
        assert res.returncode == 0, res.stderr
        res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", str(path))
        assert res.returncode == 2 and "read-only" in res.stderr, res.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["s.db"]
    finally:
        folder.chmod(0o755)


def test_a_device_or_folder_is_not_a_store(tmp_path):
    for db in (os.devnull, str(tmp_path)):
        res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", db)
        assert res.returncode == 2 and "--db" in res.stderr, res.stderr
    assert not os.path.exists(os.devnull + "-journal")

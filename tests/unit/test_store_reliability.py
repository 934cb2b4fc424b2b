"""Store: schema migrations (v0 -> current, step by step, atomic) and readers while a run writes."""

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.results import store as store_mod
from attnbench.results.record import SCHEMA_VERSION, Record
from attnbench.results.store import ResultStore, StoreError, schema_version
from attnbench.spec import AttnSpec

SRC = str(Path(__file__).resolve().parents[2] / "src")


def make_v0(path: Path) -> None:
    """A database as written before versioning: no meta table, fewer record columns."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, created_at REAL, finished_at REAL, status TEXT, "
                     "command TEXT, config TEXT, env_id TEXT, attnbench_version TEXT)")
        conn.execute("CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, "
                     "case_id TEXT NOT NULL, backend TEXT NOT NULL, status TEXT NOT NULL, spec TEXT, median_ms REAL)")
        spec = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")
        conn.execute("INSERT INTO runs VALUES ('old', 1.0, 2.0, 'done', 'attnbench run', '{}', NULL, '0.0')")
        conn.execute("INSERT INTO records (run_id, case_id, backend, status, spec, median_ms) VALUES "
                     "('old', 'c1', 'naive', 'ok', ?, 1.5)", (json.dumps(spec.to_dict()),))


def test_v0_database_is_migrated_and_keeps_its_records(tmp_path):
    db = tmp_path / "v0.db"
    make_v0(db)
    with ResultStore(db) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION
        [record] = store.records("old")
        assert record.backend == "naive" and record.median_ms == 1.5 and record.spec.seqlens_q == (17,)
        assert store.run("old")["status"] == "done"
        store.write(Record(run_id="new", backend="naive", spec=record.spec))  # every current column exists
        assert len(store.rows()) == 2


def test_migrations_run_in_order_each_in_one_transaction(tmp_path, monkeypatch):
    db = tmp_path / "current.db"
    ResultStore(db).close()  # a database at the current version
    now = SCHEMA_VERSION
    calls = []

    def add_note(conn):
        calls.append(f"v{now}->v{now + 1}")
        conn.execute("ALTER TABLE runs ADD COLUMN note TEXT")

    def broken(conn):
        calls.append(f"v{now + 1}->v{now + 2}")
        conn.execute("CREATE TABLE extra (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", now + 2)
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, add_note, broken])
    with pytest.raises(StoreError, match=f"from version {now + 1} to {now + 2} failed.*disk on fire.*unchanged"):
        ResultStore(db)
    assert calls == [f"v{now}->v{now + 1}", f"v{now + 1}->v{now + 2}"]
    with sqlite3.connect(db) as conn:  # the first step committed; the failed step left nothing behind
        assert schema_version(conn) == now + 1
        assert "note" in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name='extra'").fetchall()
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS[:now + 1], lambda conn: calls.append("fixed")])
    with ResultStore(db) as store:
        assert schema_version(store.conn) == now + 2 and calls[-1] == "fixed"


def test_newer_database_is_refused(tmp_path):
    db = tmp_path / "new.db"
    ResultStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match="schema version 99.*upgrade attnbench"):
        ResultStore(db)


def test_opening_needs_no_write_lock(tmp_path):
    db = tmp_path / "r.db"
    with ResultStore(db) as store:
        store.start_run("r", command="x", config={}, env_id=None, version="0")
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a run in the middle of writing a record holds the write lock
    try:
        t0 = time.perf_counter()
        with ResultStore(db, create=False) as reader:  # would wait for the lock if opening wrote anything
            assert reader.run("r")["status"] == "running"
        assert time.perf_counter() - t0 < 2
    finally:
        writer.execute("ROLLBACK")
        writer.close()


WRITER = """
import sys, time
sys.path.insert(0, {src!r})
from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec
spec = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")
store = ResultStore({db!r})
store.start_run("w", command="test", config={{}}, env_id=None, version="0")
deadline = time.time() + {seconds}
n = 0
while time.time() < deadline:
    store.write(Record(run_id="w", backend="naive", spec=spec.replace(seqlens_q=(17 + n,)), samples_ms=[1.0] * 50))
    n += 1
store.finish_run("w")
print(n)
"""


def test_readers_never_see_database_is_locked_while_a_run_writes(tmp_path):
    db = tmp_path / "busy.db"
    ResultStore(db).close()
    env = dict(os.environ, PYTHONPATH=SRC)
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(src=SRC, db=str(db), seconds=3)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    counts, errors = [], []
    try:
        while writer.poll() is None:
            try:
                with ResultStore(db, create=False) as reader:  # a `report` / `export` opening the file
                    rows = reader.rows("w")
                    counts.append(len(rows))
                    assert all(json.loads(r["samples_ms"]) == [1.0] * 50 for r in rows[-5:])
            except sqlite3.OperationalError as exc:
                errors.append(str(exc))
    finally:
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert errors == []
    assert len(counts) >= 5 and counts == sorted(counts)  # reads interleaved with writes, never going back
    with ResultStore(db, create=False) as reader:
        assert len(reader.rows("w")) == int(out) > counts[0]


def test_a_version_2_store_gains_the_run_process_columns_and_keeps_its_runs(tmp_path):
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:  # the layout schema version 2 wrote
        conn.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema_version', '2');"
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, created_at REAL, finished_at REAL, status TEXT, "
            "command TEXT, config TEXT, env_id TEXT, attnbench_version TEXT);"
            "INSERT INTO runs VALUES ('old', 1.0, NULL, 'running', 'attnbench run', '{}', NULL, '0.1.0');")
    with ResultStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        old = store.run("old")
        assert old["status"] == "running" and old["pid"] is None  # unknown process: left as it was
        store.start_run("new", command="c", config={}, env_id=None, version="v")
        assert store.run("new")["pid"] == os.getpid()

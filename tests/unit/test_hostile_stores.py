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


@pytest.mark.parametrize("argv, needle", [
    (["--run", ""], "empty name"), (["--all-runs", "--run", "x"], "drop --run"),
    (["--format", "json", "-o", "x.csv"], "make them agree"), (["--backend", "nosuch"], "no backend 'nosuch'"),
    (["--backend", "naive,,naive"], "empty name"), (["--run", "latest,"], "empty name"),
])
def test_export_refuses_what_it_cannot_honour(good, tmp_path, capsys, argv, needle):
    from attnbench import cli
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", "--db", str(good), *[str(tmp_path / a) if a == "x.csv" else a for a in argv]])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.csv").exists()


def test_export_takes_the_format_from_the_file_name(good, tmp_path, capsys):
    import json

    from attnbench import cli
    cli_args = ["export", "--db", str(good), "-o", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit) as exc:
        cli.main(cli_args)
    assert exc.value.code == 0
    assert json.loads((tmp_path / "x.json").read_text())[0]["backend"] == "naive"


def test_resuming_a_shard_runs_only_that_shard(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", *TINY, "--seq-lens", "16..23:+1", "--backends", "naive", "--shard", "0/2",
                    "--run-id", "R", "--db", str(db))
    assert res.returncode == 0, res.stderr
    shard = tmp_path / "r.rank0.db"
    with sqlite3.connect(shard) as conn:
        [(n,)] = conn.execute("SELECT COUNT(*) FROM records").fetchall()
        conn.execute("DELETE FROM records WHERE id IN (SELECT MAX(id) FROM records)")
        conn.execute("UPDATE runs SET status='interrupted'")
    conn.close()
    assert 0 < n < 8
    res = attnbench("run", "--resume", "R", "--db", str(shard))
    assert res.returncode == 0, res.stderr
    with sqlite3.connect(shard) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT case_id) FROM records").fetchall() == [(n, n)]
    conn.close()

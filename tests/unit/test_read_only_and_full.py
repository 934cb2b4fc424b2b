"""Stores and outputs where the file system says no: a read-only folder or file system, a full disk.

Readers see every committed record wherever the store lies (its write-ahead log included) or say why they
cannot; a full disk is called a full disk and leaves no empty store behind; an output that cannot be written
is refused, one line and exit status 2, before any work. The real file systems come from ``fs_helpers``
(skipped where they cannot be made); the in-process tests make SQLite's open or write fail as it does there.
"""

import errno
import hashlib
import json
import shutil
import sqlite3

import pytest
from fs_helpers import in_read_only, on_full_disk
from reliability_helpers import TINY, attnbench
from results_fixtures import cli, synthetic_record

from attnbench.results import files
from attnbench.results import store as store_mod
from attnbench.results.store import ResultStore, StoreError
from attnbench.spec import AttnSpec

RUN = "in-the-log"
N = 3


def _state(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def store_in_its_log(folder):
    """``folder/s.db`` whose records are all in its write-ahead log, no -shm beside it: what a writer killed
    mid-run leaves, once its shared-memory index is gone (a copy, an unpacked archive, a reboot)."""
    work = folder.parent / (folder.name + "-writer")
    work.mkdir()
    folder.mkdir()
    ResultStore(work / "s.db").close()
    with ResultStore(work / "s.db") as store:
        store.start_run(RUN, command="attnbench run", config={}, env_id=None, version="test")
        for i in range(N):
            spec = AttnSpec(seqlens_q=(16 * (i + 1),), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd")
            store.write(synthetic_record(RUN, spec, "naive", [1.0 + i, 1.1 + i]))
        store.finish_run(RUN)
        for suffix in ("", "-wal"):  # while the writer holds it open: its records are in the log only
            shutil.copy(work / f"s.db{suffix}", folder / f"s.db{suffix}")
    db = folder / "s.db"
    conn = sqlite3.connect(f"file:{db}?immutable=1", uri=True)  # the main file alone: no run, no record
    try:
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0
    finally:
        conn.close()
    return db


def _one_line(res, code=2):
    assert res.returncode == code, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("attnbench: error:"), res.stderr
    assert "Traceback" not in res.stderr
    return res.stderr


# ---- 1. a store whose records are in its write-ahead log, in a folder nobody may write ----------------------
def test_a_store_in_a_read_only_folder_shows_the_records_in_its_log(tmp_path):
    folder = tmp_path / "ro"
    db = store_in_its_log(folder)
    before = _state(folder)
    res = in_read_only(folder, "runs", "--db", db)
    assert res.returncode == 0 and RUN in res.stdout and "holds no runs" not in res.stdout, res.stdout + res.stderr
    res = in_read_only(folder, "show", "--table", "--db", db)
    assert res.returncode == 0 and res.stdout.count("naive") == N, res.stdout + res.stderr
    out = tmp_path / "all.json"
    res = in_read_only(folder, "export", "--all-runs", "--db", db, "-o", out)
    assert res.returncode == 0 and f"wrote {N} records" in res.stderr, res.stderr
    assert len(json.loads(out.read_text())) == N
    res = in_read_only(folder, "report", "--db", db, "-o", tmp_path / "r.html")
    assert res.returncode == 0 and RUN in (tmp_path / "r.html").read_text(), res.stderr
    assert _state(folder) == before  # nothing written beside it, nothing changed in it


def test_a_log_without_its_index_is_read_without_making_one(tmp_path):
    """A killed writer's log copied without its -shm, in a folder readers could write: a read-only connection
    would make the -shm there (and leave it); the reader reads a private copy instead."""
    folder = tmp_path / "copied"
    db = store_in_its_log(folder)
    before = _state(folder)
    res = cli("runs", "--db", db)
    assert res.returncode == 0 and RUN in res.stdout, res.stdout + res.stderr
    res = cli("show", "--table", "--db", db)
    assert res.returncode == 0 and res.stdout.count("naive") == N, res.stdout + res.stderr
    with ResultStore(db, readonly=True) as store:
        assert len(store.records(RUN)) == N
    assert _state(folder) == before


def _shared_open_fails(monkeypatch):
    """SQLite's read-only open of a WAL store fails where it cannot make the -shm index (a folder it cannot
    write): this makes it fail so for the store under test."""
    real = sqlite3.connect

    def connect(database, *args, **kwargs):
        if isinstance(database, str) and "mode=ro" in database:
            raise sqlite3.OperationalError("unable to open database file")
        return real(database, *args, **kwargs)
    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)


def test_a_reader_that_cannot_share_the_log_reads_a_private_copy(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    db = store_in_its_log(folder)
    before = _state(folder)
    _shared_open_fails(monkeypatch)
    with ResultStore(db, readonly=True) as store:
        assert [r["run_id"] for r in store.runs()] == [RUN]
        assert len(store.records(RUN)) == N
    assert _state(folder) == before
    res = cli("export", "--all-runs", "--db", db, "-o", tmp_path / "x.json")
    assert res.returncode == 0 and len(json.loads((tmp_path / "x.json").read_text())) == N, res.stderr


def test_a_reader_that_cannot_read_the_log_says_why(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    db = store_in_its_log(folder)
    _shared_open_fails(monkeypatch)

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(store_mod.shutil, "copyfile", no_room)
    with pytest.raises(StoreError, match="write-ahead log.*No space left"):
        ResultStore(db, readonly=True)
    for args in (["runs"], ["export", "--all-runs"], ["show"]):
        res = cli(*args, "--db", db)
        assert res.returncode == 2 and "write-ahead log" in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert "holds no runs" not in res.stdout


# ---- 2. a full disk when a store is made ------------------------------------------------------------------------
def _disk_full(monkeypatch):
    """Every database SQLite opens may hold one page: writing a second fails as a full disk does (SQLITE_FULL)."""
    real = sqlite3.connect

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        conn.execute("PRAGMA max_page_count=1")
        return conn
    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)


def test_a_full_disk_is_called_so_and_leaves_no_empty_store(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    folder.mkdir()
    _disk_full(monkeypatch)
    with pytest.raises(StoreError, match="no space left") as got:
        ResultStore(folder / "s.db")
    assert "damaged" not in str(got.value)
    assert list(folder.iterdir()) == []
    res = cli("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", folder / "new" / "s.db")
    assert res.returncode == 2 and "no space left" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert "damaged" not in res.stderr
    assert list(folder.iterdir()) == []  # neither the store nor the folder made for it


@pytest.mark.parametrize("free_kib", [0, 8, 24])
def test_a_store_on_a_full_file_system(tmp_path, free_kib):
    folder = tmp_path / "full"
    folder.mkdir()
    res, left = on_full_disk(folder, "run", *TINY, "--seq-lens", "17", "--backends", "naive",
                             "--db", folder / "new" / "s.db", free_kib=free_kib)
    assert "no space left" in _one_line(res), res.stderr
    assert left == ["filler"]


# ---- 3. outputs that cannot be written ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(tmp_path_factory):
    db = tmp_path_factory.mktemp("store") / "good.db"
    res = attnbench("run", *TINY, "--seq-lens", "17", "33", "--backends", "naive", "--db", str(db))
    assert res.returncode == 0, res.stderr
    return db


def test_check_output_refuses_what_cannot_be_written(tmp_path, monkeypatch):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "old.csv").write_text("kept\n")
    real = files.os.access
    monkeypatch.setattr(files.os, "access", lambda p, mode, **kw: False if str(p).startswith(str(folder))
                        else real(p, mode, **kw))
    for path in (folder / "x.csv", folder / "old.csv", folder / "new" / "deeper" / "x.csv"):
        with pytest.raises(files.FileRefused, match="not writable"):
            files.check_output(path, "-o")
    monkeypatch.undo()
    assert files.check_output(folder / "x.csv", "-o") == folder / "x.csv"


def test_an_output_that_fails_while_written_is_one_line_and_leaves_no_part(tmp_path, monkeypatch, good):
    out = tmp_path / "x.csv"
    out.write_text("the previous export\n")

    def read_only_fs(*args):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(files.os, "replace", read_only_fs)
    with pytest.raises(files.FileRefused, match="Read-only file system"):
        files.write_text_atomic(out, "new\n")
    res = cli("export", "--db", good, "-o", out)
    assert res.returncode == 2 and "cannot write" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert out.read_text() == "the previous export\n" and sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]


def test_outputs_into_a_read_only_folder_are_refused_before_any_work(tmp_path, good):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "old.csv").write_text("kept\n")
    before = _state(ro)
    db = tmp_path / "new.db"
    e2e = ["e2e", "--model", "llama-tiny", "--device", "cpu", "--backends", "naive", "--layers", "1", "--steps", "1",
           "--dtype", "fp32", "--seq-len", "17", "--db", db]
    for args in (["export", "--db", good, "-o", ro / "x.csv"], ["export", "--db", good, "-o", ro / "old.csv"],
                 ["report", "--db", good, "-o", ro / "r.html"],
                 ["plot", "--x", "seq_len", "--y", "ms", "--db", good, "-o", ro / "p.png"],
                 ["plot", "--x", "seq_len", "--y", "ms", "--db", good, "-o", ro / "sub" / "p.png"],
                 ["run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", db, "--output", ro / "x.json"],
                 [*e2e, "--output", ro / "e.json"]):
        res = in_read_only(ro, *args)
        line = _one_line(res)
        assert "not writable" in line or "read-only" in line, line
        assert not db.exists(), args  # refused before a run started
    assert _state(ro) == before


def test_a_report_beside_a_store_in_a_read_only_folder_is_refused_and_names_the_way_out(tmp_path, good):
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(good, ro / "s.db")
    before = _state(ro)
    res = in_read_only(ro, "report", "--db", ro / "s.db")
    assert "-o" in _one_line(res) and "not writable" in res.stderr
    res = in_read_only(ro, "plot", "--x", "seq_len", "--y", "ms", "--db", ro / "s.db")
    assert "-o" in _one_line(res) and "not writable" in res.stderr
    assert _state(ro) == before


def test_an_export_onto_a_full_file_system_is_one_line_and_leaves_no_part(tmp_path, good):
    folder = tmp_path / "full"
    folder.mkdir()
    res, left = on_full_disk(folder, "export", "--db", good, "-o", folder / "x.csv")
    assert "No space left" in _one_line(res)
    assert left == ["filler"]

"""Stores and outputs where the file system says no: a read-only folder or file system, a full disk.

Readers see every committed record wherever the store lies (its write-ahead log included) or say why they
cannot; a full disk is called a full disk and leaves no empty store behind; an output that cannot be written
is refused, one line and exit status 2, before any work. The real file systems come from ``fs_helpers``
(skipped where they cannot be made); the in-process tests make SQLite's open or write fail as it does there.
"""

import errno
import hashlib
import json
import re
import shutil
import sqlite3

import pytest
from fs_helpers import in_read_only, on_full_disk, on_small_disk
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


# ---- 2b. a disk that fills up while a run writes -----------------------------------------------------------------
SWEEP = ["--seq-lens", *map(str, range(16, 16 + 8 * 12, 8)), "--backends", "naive"]
CASES = 12


def _fills_after(monkeypatch, records: int):
    """The store's file system fills up after ``records`` records: from then on SQLite may not grow the store by
    a page (``max_page_count``), and the next write that needs one fails as on a full disk (SQLITE_FULL)."""
    real = ResultStore.write

    def write(self, record):
        real(self, record)
        if len(self.case_ids(record.run_id)) == records:
            pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
            self.conn.execute(f"PRAGMA max_page_count={pages}")
    monkeypatch.setattr(ResultStore, "write", write)


def _stopped_full(res, db) -> tuple[str, int]:
    """(run id, records the line says are stored) of a run stopped by a full disk, its line checked."""
    line = _one_line(res)
    found = re.search(r"the disk is full: (\S+) took (\d+) of the (\d+) cases of run (\S+) \(SQLite: database or "
                      r"disk is full.*\); they stay readable; once there is space, resume with: attnbench run "
                      r"--resume (\S+) --db (\S+)$", line.strip())
    assert found, line
    assert found[1] == str(db) == found[6] and found[4] == found[5] and int(found[3]) == CASES, line
    return found[4], int(found[2])


def test_a_run_whose_disk_fills_up_stops_at_once_and_resumes(tmp_path, monkeypatch):
    db = tmp_path / "s.db"
    _fills_after(monkeypatch, 3)
    res = cli("run", *TINY, *SWEEP, "--db", db)
    run, stored = _stopped_full(res, db)
    assert 3 <= stored < CASES
    monkeypatch.undo()
    with ResultStore(db, readonly=True) as store:  # every record written before, readable
        assert len(store.records(run)) == stored and store.run(run)["status"] == "interrupted"
    res = cli("show", "--run", run, "--table", "--db", db)
    assert res.returncode == 0 and res.stdout.count("naive") == stored, res.stderr
    res = cli("run", "--resume", run, "--db", db, "--quiet")
    assert res.returncode == 0, res.stderr
    with ResultStore(db, readonly=True) as store:
        assert len(store.records(run)) == CASES and store.run(run)["status"] == "done"


def test_a_disk_full_when_a_run_is_claimed_or_ends_is_the_same_line(tmp_path, monkeypatch):
    db = tmp_path / "s.db"
    ResultStore(db).close()
    with ResultStore(db) as store, pytest.raises(store_mod.StoreFull, match="the disk is full") as got:
        store.conn.execute(f"PRAGMA max_page_count={store.conn.execute('PRAGMA page_count').fetchone()[0]}")
        for i in range(400):  # runs until a page more is needed
            store.start_run(f"r{i}", command="attnbench run " + "x" * 200, config={}, env_id=None, version="t")
    assert "free some space and run the command again" in str(got.value) and str(db) in str(got.value)
    real = ResultStore.finish_run

    def full_at_the_end(self, run_id, status="done"):  # every record fits; recording the run as done does not
        self.conn = _FullOn(self.conn, "UPDATE runs SET finished_at")
        real(self, run_id, status)
    monkeypatch.setattr(ResultStore, "finish_run", full_at_the_end)
    res = cli("run", *TINY, *SWEEP, "--db", db)
    run, stored = _stopped_full(res, db)
    assert stored == CASES
    monkeypatch.undo()
    with ResultStore(db, readonly=True) as store:  # 'running' as long as its process lives (this one here)
        assert len(store.records(run)) == CASES and store.run(run)["status"] == "running"
    res = cli("run", "--resume", run, "--db", db, "--quiet")
    assert res.returncode == 0, res.stderr
    with ResultStore(db, readonly=True) as store:
        assert store.run(run)["status"] == "done"


def test_a_run_on_a_file_system_that_fills_up(tmp_path):
    """The same on a real file system of 160 KiB, which the store and its log fill after a few records: the run
    stops with its line; every reader works on the full disk; outputs onto it are refused whole; with room
    again, the resume completes the run."""
    folder = tmp_path / "small"
    folder.mkdir()
    db, out = folder / "s.db", tmp_path / "x.json"
    many = ["--seq-lens", *map(str, range(16, 16 + 8 * 60, 8)), "--backends", "naive", "--min-time-ms", "1",
            "--max-time-ms", "2"]  # small records: a few fit, whatever the speed of the machine
    run, runs, show, export, export_onto, report_onto, another, too_soon, resumed, whole = on_small_disk(
        folder, 160, ["run", *TINY, *many, "--run-id", "filled", "--db", db], ["runs", "--db", db],
        ["show", "--run", "filled", "--table", "--db", db], ["export", "--run", "filled", "--db", db, "-o", out],
        ["export", "--run", "filled", "--db", db, "-o", folder / "x.csv"],
        ["report", "--run", "filled", "--db", db, "-o", folder / "r.html"],
        ["run", *TINY, *many, "--run-id", "another", "--db", db], ["run", "--resume", "filled", "--db", db, "--quiet"],
        ("grow", 4096), ["run", "--resume", "filled", "--db", db, "--quiet"],
        ["export", "--run", "filled", "--db", db, "-o", tmp_path / "all.json"])
    line = _one_line(run)
    found = re.search(r"the disk is full: (\S+) took (\d+) of the 60 cases of run filled \(SQLite: database or disk "
                      r"is full; 0 KiB free there\); they stay readable; once there is space, resume with: attnbench "
                      r"run --resume filled --db (\S+)$", line.strip())
    assert found and found[1] == found[3] == str(db), line
    stored = int(found[2])
    assert 1 <= stored < 60 and run.names == ["s.db", "s.db-shm", "s.db-wal"]  # no temporary file left
    assert runs.returncode == 0 and "filled" in runs.stdout and "interrupted" in runs.stdout, runs.stdout + runs.stderr
    assert show.returncode == 0 and show.stdout.count("naive") == stored, show.stdout + show.stderr
    assert export.returncode == 0 and len(json.loads(out.read_text())) == stored, export.stderr
    for res in (export_onto, report_onto):
        assert "No space left" in _one_line(res) and res.names == ["s.db", "s.db-shm", "s.db-wal"]
    for res, run_id in ((another, "another"), (too_soon, "filled")):  # when it is claimed, or at its next record
        line = _one_line(res)
        assert "the disk is full" in line and f"run {run_id}" in line, line
        assert "readable" in line or f"no record of run {run_id} was stored" in line, line
    assert resumed.returncode == 0 and resumed.names == ["s.db"], resumed.stderr
    assert whole.returncode == 0 and len(json.loads((tmp_path / "all.json").read_text())) == 60, whole.stderr


class _FullOn:
    """A store's connection on which a statement starting with ``sql`` fails as SQLite fails on a full disk."""

    def __init__(self, conn, sql):
        self._conn, self._sql = conn, sql

    def execute(self, sql, *args):
        if sql.startswith(self._sql):
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __enter__(self):
        return self._conn.__enter__()

    def __exit__(self, *exc):
        return self._conn.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._conn, name)


@pytest.mark.parametrize("command", ["verify", "e2e"])
def test_other_commands_whose_disk_fills_up_stop_with_one_line(tmp_path, monkeypatch, command):
    db = tmp_path / "s.db"
    _fills_after(monkeypatch, 1)
    if command == "verify":
        args = ["verify", "--device", "cpu", "--q-heads", "1", "--head-size", "8", "--dtype", "fp32", *SWEEP]
    else:
        args = ["e2e", "--model", "llama-tiny", "--device", "cpu", "--backends", "naive,sdpa-math", "--layers", "1",
                "--steps", "1", "--dtype", "fp32", "--seq-len", "17"]
        monkeypatch.setattr(ResultStore, "write", _full_after_one(ResultStore.write))
    res = cli(*args, "--db", db)
    line = _one_line(res)
    assert "the disk is full" in line and str(db) in line and re.search(r"1 record of run \S+ written before stays readable", line), line
    monkeypatch.undo()
    with ResultStore(db, readonly=True) as store:
        [run] = store.runs()
        assert len(store.records(run["run_id"])) >= 1


def _full_after_one(write):
    """``write`` on a store whose disk is full after its first record (an e2e run writes two or three small
    records, which may all fit in the pages the store has)."""
    def limited(self, record):
        if self.case_ids(record.run_id) and not isinstance(self.conn, _FullOn):
            self.conn = _FullOn(self.conn, "INSERT INTO records")
        return write(self, record)
    return limited


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


def test_a_run_whose_output_does_not_fit_says_its_records_are_stored(tmp_path, monkeypatch):
    """The records are in the store before --output is written: its failure says so, and how to export them."""
    out, db = tmp_path / "out.json", tmp_path / "s.db"
    out.write_text("[]\n")

    def no_room(fd):  # as a file system that allocates on write-back reports a full disk
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", no_room)
    res = cli("run", *TINY, *SWEEP[:3], "--backends", "naive", "--run-id", "kept", "--db", db, "--output", out)
    line = _one_line(res)
    assert f"cannot write {out}: No space left on device; it is as it was; the 2 records of run kept are stored in " \
           f"{db}: attnbench export --run kept --db {db} -o {out} writes them" in line, line
    assert out.read_text() == "[]\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "s.db"]
    monkeypatch.undo()
    with ResultStore(db, readonly=True) as store:
        assert len(store.records("kept")) == 2 and store.run("kept")["status"] == "done"


def test_a_run_whose_output_is_on_a_full_file_system(tmp_path):
    folder = tmp_path / "full"
    folder.mkdir()
    db = tmp_path / "s.db"
    res, left = on_full_disk(folder, "run", *TINY, *SWEEP[:3], "--backends", "naive", "--run-id", "kept", "--db", db,
                             "--output", folder / "x.json")
    assert "No space left" in _one_line(res) and "attnbench export --run kept" in res.stderr
    assert left == ["filler"]
    with ResultStore(db, readonly=True) as store:
        assert len(store.records("kept")) == 2


@pytest.mark.parametrize("args", [["export", "-o", "x.csv"], ["export", "-o", "x.parquet"], ["report", "-o", "r.html"],
                                  ["plot", "--x", "seq_len", "--y", "ms", "-o", "p.png"]])
def test_an_output_onto_a_full_file_system_is_one_line_and_leaves_no_part(tmp_path, good, args):
    if args[-1].endswith(".parquet"):
        pytest.importorskip("pyarrow")
    folder = tmp_path / "full"
    folder.mkdir()
    res, left = on_full_disk(folder, *args[:-1], folder / args[-1], "--db", good)
    assert "No space left" in _one_line(res)
    assert left == ["filler"]

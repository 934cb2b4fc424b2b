"""A damaged, foreign, newer or unreadable store is one line and exit 2, and is never changed; readers open
stores read-only."""

import hashlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys

import pytest
from reliability_helpers import TINY, attnbench
from results_fixtures import cli, synthetic_record

from attnbench.results import scratch
from attnbench.results.record import SCHEMA_VERSION
from attnbench.results.store import ResultStore, StoreError
from attnbench.spec import AttnSpec


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
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s.db")) == ["s.db"]


def test_readers_write_nothing_to_a_current_store(good, tmp_path):
    path = _copy(good, tmp_path, "s.db")
    before, stamp = digest(path), path.stat().st_mtime_ns
    with ResultStore(path, readonly=True) as store:
        assert store.records() and store.schema_version == SCHEMA_VERSION
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.conn.execute("DELETE FROM records")
    assert digest(path) == before and path.stat().st_mtime_ns == stamp


def _folder_state(folder):
    return {p.name: (digest(p), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_readers_leave_a_store_and_its_folder_as_they_found_them(good, tmp_path):
    """A store nobody has open is a WAL file alone; a read-only connection to it made a -wal and a -shm beside it
    that it could not remove, so every listing, export or report left them there for good."""
    folder = tmp_path / "store"
    folder.mkdir()
    path = _copy(good, folder, "s.db")
    with sqlite3.connect(path) as conn:  # as a run leaves it: WAL mode, no side file
        conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    before = _folder_state(folder)
    assert list(before) == ["s.db"]
    out = tmp_path / "out"
    for args in (["runs"], ["show", "--table"], ["export", "--all-runs"], ["export", "--all-runs", "-o", out / "x.csv"],
                 ["report", "-o", out / "r.html"], ["compare", "latest", "latest"]):
        res = cli(*args, "--db", path)
        assert res.returncode == 0, (args, res.stderr)
        assert _folder_state(folder) == before, args
    with ResultStore(path, readonly=True) as store:
        assert sorted(p.name for p in folder.iterdir()) != ["s.db"]  # SQLite's, while it reads
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.conn.execute("DELETE FROM records")
    assert _folder_state(folder) == before


def test_a_reader_and_a_writer_at_once_leave_the_records_and_no_side_files_of_the_reader(good, tmp_path):
    """Whichever opens first, the reader sees the writer's records and makes no file of its own. A reader that
    outlives the writer cannot fold the writer's log into the file (it writes nothing): the writer's -wal and
    -shm stay until the next writer closes the store."""
    path = _copy(good, tmp_path, "s.db")
    spec = AttnSpec(seqlens_q=(16,), heads_q=2, head_dim=8, dtype="fp32")
    for first in ("reader", "writer"):
        run = f"by-{first}-first"
        if first == "reader":
            reader = ResultStore(path, readonly=True)
            writer = ResultStore(path)
        else:
            writer = ResultStore(path)
            reader = ResultStore(path, readonly=True)
        writer.start_run(run, command="attnbench run", config={}, env_id=None, version="test")
        writer.write(synthetic_record(run, spec, "naive", [1.0]))
        writer.finish_run(run)
        assert len(reader.records(run)) == 1  # committed in the log: the reader sees it
        writer.close()
        assert len(reader.records(run)) == 1
        reader.close()
        if first == "writer":
            assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db", "s.db-shm", "s.db-wal"]
            with ResultStore(path, readonly=True) as again:
                assert len(again.records(run)) == 1
            ResultStore(path).close()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"], first
        with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as conn:  # in the file itself now
            assert conn.execute("SELECT COUNT(*) FROM records WHERE run_id=?", (run,)).fetchone()[0] == 1
        conn.close()


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


# ---- what attnbench writes never lands on a store, and replaces a file whole -----------------------------
def _one_line(res, code=2):
    assert res.returncode == code, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("attnbench: error:"), res.stderr
    return res.stderr


@pytest.mark.parametrize("argv, needle", [
    (["export", "-o", "{db}"], "this command writes"), (["export", "-o", "{db}-wal"], "this command writes"),
    (["export", "-o", "{db}-shm"], "this command writes"), (["export", "-o", "{other}"], "does not write over it"),
    (["export", "-o", "{other}-wal"], "side file of the database"), (["report", "-o", "{db}"], "this command writes"),
    (["report", "-o", "{other}"], "does not write over it"),
    (["plot", "--x", "seq_len", "--y", "ms", "-o", "{png}"], "does not write over it"),
])
def test_an_output_never_replaces_a_store_or_its_side_files(good, tmp_path, argv, needle):
    db, other, png = _copy(good, tmp_path, "s.db"), _copy(good, tmp_path, "other.db"), _copy(good, tmp_path, "x.png")
    (tmp_path / "other.db-wal").write_bytes(b"")  # a log a reader left beside it
    conn = sqlite3.connect(db)  # a store whose latest change sits in its write-ahead log while this stays open
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    with conn:
        conn.execute("UPDATE runs SET command = 'in the log'")
    try:
        before = {p.name: digest(p) for p in tmp_path.iterdir() if not p.name.endswith("-shm")}
        res = attnbench(*[a.format(db=db, other=other, png=png) for a in argv], "--db", str(db))
        assert needle in _one_line(res)
        # the -shm index changes as readers come and go; the files that hold data stay byte for byte
        assert {p.name: digest(p) for p in tmp_path.iterdir() if not p.name.endswith("-shm")} == before
        assert (tmp_path / "s.db-shm").read_bytes()[:6] != b"run_id"
    finally:
        conn.close()


def test_a_run_whose_output_is_its_own_store_is_refused_before_it_runs(tmp_path):
    store = tmp_path / "r.json"
    res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", str(store), "--output", str(store))
    assert "the results store this command writes" in _one_line(res)
    assert not store.exists()


def test_outputs_are_replaced_whole_or_not_at_all(good, tmp_path, monkeypatch):
    from attnbench.results import export, files
    out = tmp_path / "x.json"
    out.write_text("the previous export\n")
    out.chmod(0o640)
    with ResultStore(good, readonly=True) as store:
        rows = store.rows()

    def disk_full(*args, **kwargs):  # the export fails after its file was opened
        raise RuntimeError("disk full")
    monkeypatch.setattr(export.json, "dumps", disk_full)
    with pytest.raises(RuntimeError, match="disk full"):
        export.write(rows, out)
    assert out.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # no temporary file left behind
    monkeypatch.undo()
    export.write(rows, out)
    assert out.read_text().startswith("[") and (out.stat().st_mode & 0o777) == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(out)
    files.write_text_atomic(link, "through the link\n")
    assert link.is_symlink() and out.read_text() == "through the link\n"


# ---- a database that is not an attnbench store, or a damaged one, is never written --------------------------
@pytest.mark.parametrize("tables", [
    ["CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", "INSERT INTO meta VALUES ('owner', 'me')",
     "CREATE TABLE users (x)"],
    ["CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)"],
    ["CREATE TABLE records (id INTEGER PRIMARY KEY, payload BLOB)"],
])
def test_another_programs_tables_of_attnbench_names_are_not_taken_for_a_store(good, tmp_path, tables):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        for sql in tables:
            conn.execute(sql)
    conn.close()
    before = digest(path)
    for args in (["run", *TINY, "--seq-lens", "17", "--backends", "naive"], ["export", "-o", str(tmp_path / "x.csv")],
                 ["merge", str(path), str(good)], ["repair"], ["calibrate", "--device", "cpu"]):
        res = attnbench(*args, *([] if args[0] == "merge" else ["--db", str(path)]))
        assert "database of something else" in _one_line(res), args
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def _damage_index(good, tmp_path):
    """A store whose records_case index page has a broken header (SQLite reads the file, quick_check fails)."""
    path = _copy(good, tmp_path, "s.db")
    with sqlite3.connect(path) as conn:
        page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='records_case'").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    data[(page - 1) * size + 1:(page - 1) * size + 8] = b"\xff" * 7
    path.write_bytes(bytes(data))
    return path


def test_a_store_damaged_inside_is_refused_before_a_run_writes(good, tmp_path):
    path = _damage_index(good, tmp_path)
    before = digest(path)
    res = attnbench("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", str(path))
    assert "is damaged (SQLite:" in _one_line(res) and "leaves it as it is" in res.stderr
    res = attnbench("e2e", "--model", "llama-tiny", "--device", "cpu", "--db", str(path))
    assert "is damaged" in _one_line(res)
    res = attnbench("export", "--db", str(path), "-o", str(tmp_path / "x.csv"))  # a reader meets the damage
    assert "could not be read" in _one_line(res)
    assert digest(path) == before


def test_a_big_store_is_checked_where_a_writer_touches_it(good, tmp_path, monkeypatch):
    from attnbench.results import integrity
    monkeypatch.setattr(integrity, "FULL_CHECK_BYTES", 0)  # every store is "big": the partial check
    path = _damage_index(good, tmp_path)
    with pytest.raises(StoreError, match="is damaged"):
        ResultStore(path)
    truncated = tmp_path / "t.db"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size - 4096])
    with pytest.raises(StoreError, match="truncated|damaged"):
        ResultStore(truncated)
    with ResultStore(_copy(good, tmp_path, "fine.db")) as store:  # a sound big store opens
        assert store.records()


def test_check_writable_finds_what_a_writer_would_refuse_and_creates_nothing(good, tmp_path):
    ResultStore.check_writable(tmp_path / "new" / "r.db")  # a new store: fine, nothing made
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    damaged = _damage_index(good, tmp_path)
    before = digest(damaged)
    with pytest.raises(StoreError, match="is damaged"):
        ResultStore.check_writable(damaged)
    assert digest(damaged) == before
    with pytest.raises(StoreError, match="side file"):
        ResultStore.check_writable(tmp_path / "s.db-wal")


# ---- repair: everything checked first, a copy swapped in whole, the original untouched on refusal ----------
DUPLICATE = ("INSERT INTO records (run_id, case_id, backend, status, spec, created_at) SELECT run_id, case_id, "
             "backend, status, spec, created_at FROM records")


def _with_duplicates(good, tmp_path, name="d.db", in_log=False):
    """A version-3 store in WAL mode (as attnbench writes them) in which its one record is there twice, as
    stores written before schema 4 can be; ``in_log``: the change still in the write-ahead log, as a writer
    killed before a checkpoint leaves it."""
    path = _copy(good, tmp_path, name)
    script = (f"import sqlite3, os; c = sqlite3.connect({str(path)!r}); c.execute('PRAGMA journal_mode=WAL'); "
              "c.execute('PRAGMA wal_autocheckpoint=0'); c.execute('DROP INDEX records_case'); "
              f"c.execute({DUPLICATE!r}); c.execute(\"UPDATE meta SET value='3' WHERE key='schema_version'\"); "
              f"c.commit(); {'os._exit(0)' if in_log else 'c.close()'}")
    subprocess.run([sys.executable, "-c", script], check=True)
    return path


def _state(folder):
    """Every file's digest, but for an empty -wal or any -shm: SQLite makes those for a WAL-mode file it opens,
    even read-only (an index of the log, reset by the next first opener; an empty log)."""
    return {p.name: digest(p) for p in folder.iterdir() if p.is_file() and not p.name.endswith("-shm")
            and not (p.name.endswith("-wal") and p.stat().st_size == 0)}


def test_repair_keeps_the_first_record_of_each_case_and_swaps_a_checked_copy_in(good, tmp_path):
    path = _with_duplicates(good, tmp_path, in_log=True)
    assert (tmp_path / "d.db-wal").stat().st_size > 0  # the duplicates are in the log, not yet in the file
    path.chmod(0o640)
    res = attnbench("repair", "--db", str(path))
    assert res.returncode == 0 and "removed 1 duplicate record" in res.stdout, res.stderr
    assert set(_state(tmp_path)) == {"d.db"}  # no copy, and no log with frames left to replay onto the new file
    assert (path.stat().st_mode & 0o777) == 0o640
    with ResultStore(path, readonly=True) as store:
        assert store.schema_version == SCHEMA_VERSION and len(store.records()) == 1
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()
    again = attnbench("repair", "--db", str(path))
    assert again.returncode == 0 and "nothing changed" in again.stdout


@pytest.mark.parametrize("hostile, needle", [
    ("damaged", "is damaged"), ("newer", "schema version 99"), ("foreign", "something else"),
    ("text", "not a SQLite database"), ("live run", "is being written by pid"), ("open", "open elsewhere"),
])
def test_repair_refuses_before_it_changes_anything(good, tmp_path, hostile, needle):
    path = _with_duplicates(good, tmp_path)
    holder = None
    if hostile == "damaged":
        data = bytearray(path.read_bytes())
        data[4096 * 3 + 1:4096 * 3 + 8] = b"\xff" * 7  # a b-tree page's header
        path.write_bytes(bytes(data))
    elif hostile == "newer":
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
        conn.close()
    elif hostile == "foreign":
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM meta")
            conn.execute("CREATE TABLE photos (x)")
        conn.close()
    elif hostile == "text":
        path.write_text("hello\n")
    else:
        holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
                                   "c.execute('SELECT COUNT(*) FROM records').fetchone(); print('open', flush=True); "
                                   "time.sleep(60)", str(path)], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "open"
        if hostile == "live run":  # the holder is the process that runs it
            from attnbench.results.store import process_started
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE runs SET status='running', host=?, pid=?, pid_started=?",
                             (socket.gethostname(), holder.pid, process_started(holder.pid)))
            conn.close()
    try:
        before = _state(tmp_path)
        res = attnbench("repair", "--db", str(path))
        assert needle in _one_line(res)
        assert _state(tmp_path) == before  # the file byte for byte, and no copy left beside it
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize("sql, said", [(None, "nothing changed"), (HOSTILE["newer"][0], "schema version 99")])
def test_repair_that_changes_nothing_leaves_nothing_beside_the_store(good, tmp_path, sql, said):
    """Its checks read the store; as a reader's, their connection made a -wal and a -shm it left behind."""
    path = _copy(good, tmp_path, "s.db", sql)
    with sqlite3.connect(path) as conn:  # as a run leaves it: WAL mode, no side file
        conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    before = _folder_state(tmp_path)
    res = cli("repair", "--db", path)
    assert said in res.stdout + res.stderr, res.stdout + res.stderr
    assert _folder_state(tmp_path) == before


def test_repair_that_fails_part_way_leaves_the_original_and_no_copy(good, tmp_path, monkeypatch):
    from attnbench.results import repair as repairmod
    path = _with_duplicates(good, tmp_path)
    before = _state(tmp_path)
    real = repairmod._build_copy

    def then_fail(path, tmp, expected):
        real(path, tmp, expected)
        raise OSError("disk full")
    monkeypatch.setattr(repairmod, "_build_copy", then_fail)
    with pytest.raises(OSError, match="disk full"):
        repairmod.repair(path)
    assert _state(tmp_path) == before

    def and_meanwhile_a_writer(path, tmp, expected):  # a record lands in the original while the copy is made
        real(path, tmp, expected)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET command='changed meanwhile'")
        conn.close()
    monkeypatch.setattr(repairmod, "_build_copy", and_meanwhile_a_writer)
    with pytest.raises(StoreError, match="written while it was being repaired"):
        repairmod.repair(path)
    with sqlite3.connect(path) as conn:  # the writer's change kept, the duplicates not removed behind its back
        assert conn.execute("SELECT command FROM runs").fetchone()[0] == "changed meanwhile"
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 2
    conn.close()
    assert not [p for p in tmp_path.iterdir() if scratch.MARK in p.name]  # the copy under its temporary name


# ---- merge: all inputs checked first, one transaction ---------------------------------------------------
def test_a_merge_that_meets_a_bad_input_changes_nothing(good, tmp_path):
    out, first = _copy(good, tmp_path, "out.db"), _copy(good, tmp_path, "a.db")
    with sqlite3.connect(first) as conn:
        conn.execute("UPDATE records SET run_id='other'")
        conn.execute("UPDATE runs SET run_id='other'")
    conn.close()
    bad = tmp_path / "bad.db"
    bad.write_text("not a database\n")
    before = digest(out)
    for target in (out, tmp_path / "new.db"):
        res = attnbench("merge", str(target), str(first), str(bad))
        assert "not a SQLite database" in _one_line(res)
    assert digest(out) == before and not (tmp_path / "new.db").exists()
    res = attnbench("merge", str(out), str(first))
    assert res.returncode == 0, res.stderr
    with ResultStore(out, readonly=True) as store:
        assert "other" in {r["run_id"] for r in store.runs()} and len(store.records()) == 2


def test_damage_that_hides_the_store_is_called_damage_not_another_program(good, tmp_path):
    """A broken meta index made the schema row unreadable: the store read as "a database of something else"."""
    path = _copy(good, tmp_path, "meta.db")
    conn = sqlite3.connect(path)
    page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='sqlite_autoindex_meta_1'").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    data[(page - 1) * size + 8:(page - 1) * size + 14] = b"\x00\x07" * 3  # cell pointers out of range
    path.write_bytes(bytes(data))
    before = digest(path)
    for args in (("run", *TINY, "--seq-lens", "17", "--backends", "naive"), ("show",), ("repair",)):
        res = attnbench(*args, "--db", str(path))
        assert res.returncode == 2 and "is damaged (SQLite:" in _one_line(res) and "something else" not in res.stderr
    assert digest(path) == before

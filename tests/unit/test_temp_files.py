"""attnbench's own temporary files: none stays beside a user's files once a command has ended, and those a
killed process left are removed by a later command that writes there, never those of a live process nor
files of other programs (``attnbench.results.scratch``)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from reliability_helpers import SRC, TINY
from results_fixtures import cli, synthetic_record

from attnbench.results import files, scratch
from attnbench.results import store as store_mod
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

DAY = scratch.STALE_ELSEWHERE_S


def test_a_new_store_leaves_only_itself(tmp_path):
    """The store is built under a temporary name and linked into place; the temporary name goes (it stayed,
    a second hard link to the store, after every store made)."""
    ResultStore(tmp_path / "s.db").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]
    made = []

    def make():
        ResultStore(tmp_path / "t.db").close()
        made.append(True)
    threads = [threading.Thread(target=make) for _ in range(4)]  # several processes make one store at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [True] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db", "t.db"]


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def name(target: str, pid: int, host: str | None = None, suffix: str = "") -> str:
    return f".{target}.{scratch.host_tag(host)}-{pid}-0123abcd.{scratch.MARK}{suffix}"


def aged(path, seconds: float):
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def leftovers(folder, live: int) -> tuple[set[str], set[str]]:
    """Names a killed process left in ``folder`` (stale) and names that must stay (a live process's, another
    host's of an hour ago, other programs' files)."""
    dead = dead_pid()
    stale = {name("s.db", dead), name("s.db", dead, suffix="-wal"), name("s.db", dead, suffix="-journal"),
             name("x.csv", dead), name("s.db", 4242, host="elsewhere")}
    kept = {name("s.db", live), name("s.db", live, suffix="-wal"), name("x.csv", os.getpid()),
            name("x.csv", 4243, host="elsewhere"),  # another host's, an hour old: its process may still run
            f".x.csv.{dead}.tmp", ".bashrc", f"notes.{dead}.attnbench-tmp", "attnbench-read-kept"}
    for n in stale | kept:
        aged(folder / n, DAY + 60 if "4242" in n else 3600)
    return stale, kept


def names(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_stale_names_go_and_live_ones_stay(tmp_path, live_pid):
    stale, kept = leftovers(tmp_path, live_pid)
    assert set(scratch.remove_stale(tmp_path)) == stale
    assert names(tmp_path) == kept
    assert scratch.remove_stale(tmp_path / "missing") == []


def test_earlier_versions_names_go_once_old(tmp_path, live_pid):
    dead = dead_pid()
    old = {f".s.db.{dead}.0123abcd.new", f".s.db.{dead}.0123abcd.new-wal", f".s.db.repair-{dead}",
           f".s.db.repair-{dead}-shm"}
    young = {f".t.db.{dead}.0123abcd.new", f".t.db.repair-{dead}"}  # may be another host's, at work now
    alive = {f".u.db.{live_pid}.0123abcd.new", f".u.db.repair-{live_pid}"}
    for n in old | alive:
        aged(tmp_path / n, DAY + 60)
    for n in young:
        aged(tmp_path / n, 60)
    assert set(scratch.remove_stale(tmp_path)) == old
    assert names(tmp_path) == young | alive


def test_a_folder_of_a_killed_process_goes(tmp_path, monkeypatch, live_pid):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    dead = dead_pid()
    gone = tmp_path / f"attnbench-profile.{scratch.host_tag()}-{dead}-abc_12xy.{scratch.MARK}"
    kept = tmp_path / f"attnbench-profile.{scratch.host_tag()}-{live_pid}-abc_12xy.{scratch.MARK}"
    for folder in (gone, kept):
        (folder / "trace").mkdir(parents=True)
        (folder / "trace" / "big.nsys-rep").write_bytes(b"x" * 1000)
    link = tmp_path / f"attnbench-read.{scratch.host_tag()}-{dead}-abc_12xz.{scratch.MARK}"
    link.symlink_to(kept, target_is_directory=True)  # a link is removed, never what it points to
    made = scratch.temp_dir("read")
    assert made.parent == tmp_path and made.is_dir() and scratch.MARK in made.name
    assert names(tmp_path) == {kept.name, made.name} and (kept / "trace" / "big.nsys-rep").exists()


def test_commands_that_write_remove_what_killed_ones_left(tmp_path, live_pid):
    """A writer of a store removes the stale names beside it; an output's writer those beside the output;
    a reader nothing."""
    db = tmp_path / "s.db"
    with ResultStore(db) as store:
        store.start_run("r", command="attnbench run", config={}, env_id=None, version="test")
        store.write(synthetic_record("r", AttnSpec(seqlens_q=(16,), heads_q=2, head_dim=8, dtype="fp32"),
                                     "naive", [1.0]))
        store.finish_run("r")
    stale, kept = leftovers(tmp_path, live_pid)
    before = names(tmp_path)
    for args in (["runs"], ["show", "--table"], ["export", "--run", "r"]):
        assert cli(*args, "--db", db).returncode == 0
    assert names(tmp_path) == before  # readers leave every name as it was
    res = cli("run", *TINY, "--seq-lens", "17", "--backends", "naive", "--db", db)
    assert res.returncode == 0, res.err
    assert names(tmp_path) == kept | {"s.db"}
    out = tmp_path / "out"
    out.mkdir()
    stale, kept = leftovers(out, live_pid)
    res = cli("export", "--run", "r", "--db", db, "-o", out / "x.csv")
    assert res.returncode == 0, res.err
    assert names(out) == kept | {"x.csv"}


KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {src!r})
from pathlib import Path
from attnbench.results import files

def write(tmp):
    tmp.write_text("part of an export")
    print(tmp, flush=True)
    time.sleep(600)
files.write_atomic(Path({target!r}), write)
"""


def test_a_killed_write_leaves_a_name_the_next_write_removes(tmp_path):
    """SIGKILL in the middle of an output's write: the old output stays as it was, the temporary file stays
    (nothing can remove it then), and the next command that writes into the folder removes it."""
    target = tmp_path / "x.json"
    target.write_text("[]\n")
    code = textwrap.dedent(KILLED_WRITER.format(src=SRC, target=str(target)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tmp = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.basename(tmp) in names(tmp_path) and target.read_text() == "[]\n"
    files.write_text_atomic(tmp_path / "other.json", "{}\n")
    assert names(tmp_path) == {"x.json", "other.json"}


def test_a_private_copy_goes_when_its_reader_is_done(tmp_path, monkeypatch):
    """A reader that cannot share a store's log reads a copy in a folder of its own, removed on close."""
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    db = tmp_path / "s.db"
    writer = ResultStore(db)
    writer.start_run("r", command="attnbench run", config={}, env_id=None, version="test")  # in the log
    real = store_mod.sqlite3.connect

    def connect(database, *args, **kwargs):
        if isinstance(database, str) and "mode=ro" in database:
            raise store_mod.sqlite3.OperationalError("unable to open database file")
        return real(database, *args, **kwargs)
    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)
    try:
        with ResultStore(db, readonly=True) as reader:
            [copy] = (tmp_path / "tmp").iterdir()
            assert copy.name.startswith("attnbench-read.") and [r["run_id"] for r in reader.runs()] == ["r"]
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        writer.close()

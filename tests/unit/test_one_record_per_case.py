"""One record per (run, case), enforced by the store: a second writer of a run id is refused, a resume of a run
whose process is alive is refused, a duplicate insert is refused, a store that already holds duplicates is
reported and repaired, and an axis value given twice is one case."""

import sqlite3
import subprocess
import sys

import pytest

from attnbench.cli import main
from attnbench.results.record import Record
from attnbench.results.store import DuplicateRecords, ResultStore, RunClaimed, process_started, schema_version
from attnbench.spec import AttnSpec

SPEC = AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")


def _start(store, run_id, resume=False):
    store.start_run(run_id, command="test", config={}, env_id=None, version="0", resume=resume)


def test_a_second_writer_of_one_run_id_is_refused(tmp_path):
    with ResultStore(tmp_path / "r.db") as first, ResultStore(tmp_path / "r.db") as second:
        _start(first, "R")
        with pytest.raises(RunClaimed, match="run R already exists"):
            _start(second, "R")


def test_a_resume_of_a_run_whose_process_is_alive_is_refused(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ResultStore(tmp_path / "r.db") as store:
            _start(store, "R")
            with store.conn:  # as if that live process had started the run
                store.conn.execute("UPDATE runs SET pid=?, pid_started=? WHERE run_id='R'",
                                   (live.pid, process_started(live.pid)))
            with pytest.raises(RunClaimed, match=f"still running \\(pid {live.pid}\\)"):
                _start(store, "R", resume=True)
    finally:
        live.kill()
        live.wait()
    with ResultStore(tmp_path / "r.db") as store:  # the process is gone: the run is interrupted, and resumable
        assert store.run("R")["status"] == "interrupted"
        _start(store, "R", resume=True)


def test_the_store_refuses_a_second_record_of_one_case(tmp_path):
    with ResultStore(tmp_path / "r.db") as store:
        store.write(Record(run_id="R", backend="naive", spec=SPEC))
        store.write(Record(run_id="other", backend="naive", spec=SPEC))  # another run: fine
        with pytest.raises(RunClaimed, match="already has a record of naive"):
            store.write(Record(run_id="R", backend="naive", spec=SPEC))
        assert len(store.records("R")) == 1


def test_a_store_with_duplicates_is_reported_then_repaired(tmp_path, capsys):
    db = tmp_path / "r.db"
    with ResultStore(db) as store:
        store.write(Record(run_id="R", backend="naive", spec=SPEC))
    with sqlite3.connect(db) as conn:  # as a store written before the constraint: v3, two records of one case
        conn.execute("DROP INDEX records_case")
        conn.execute("INSERT INTO records (run_id, case_id, backend, status, spec, created_at) SELECT run_id, "
                     "case_id, backend, status, spec, created_at FROM records")
        conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    conn.close()  # repair refuses a store another connection holds open
    with pytest.raises(DuplicateRecords, match="1 case of a run hold"):
        ResultStore(db)
    with sqlite3.connect(db) as conn:
        assert schema_version(conn) == 3  # unchanged
    conn.close()
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--db", str(db), "--all-runs"])
    assert exit_info.value.code == 2 and "attnbench repair" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["repair", "--db", str(db)])
    assert exit_info.value.code == 0 and "removed 1 duplicate record" in capsys.readouterr().out
    with ResultStore(db) as store:
        assert len(store.records("R")) == 1


def test_an_axis_value_given_twice_is_one_case(tmp_path):
    db = tmp_path / "r.db"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--device", "cpu", "--backends", "naive", "--seq-lens", "64", "128", "64", "--pass", "fwd",
              "--pass", "fwd", "--no-causal", "--q-heads", "2", "--head-size", "16", "--repeat", "3",
              "--min-time-ms", "0", "--db", str(db), "--quiet"])
    assert exit_info.value.code == 0
    with ResultStore(db) as store:
        assert sorted(r.spec.seqlens_q for r in store.records()) == [(64,), (128,)]


def test_merge_keeps_two_runs_that_share_an_id_apart(tmp_path, capsys):
    for name, ms in (("a", 1.0), ("b", 2.0)):  # two machines, one --run-id, the same case
        with ResultStore(tmp_path / f"{name}.db") as store:
            _start(store, "R")
            store.write(Record(run_id="R", backend="naive", spec=SPEC, median_ms=ms))
    with ResultStore(tmp_path / "shard.db") as store:  # a part of R with another case: merged into R
        store.write(Record(run_id="R", backend="naive", spec=SPEC.replace(seqlens_q=(33,)), median_ms=3.0))
    out = tmp_path / "m.db"
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", str(out), str(tmp_path / "a.db"), str(tmp_path / "b.db"), str(tmp_path / "shard.db")])
    assert exit_info.value.code == 0
    assert "kept apart as R-2" in " ".join(capsys.readouterr().out.split())  # however the long paths wrap it
    with ResultStore(out) as store:
        assert sorted(r.median_ms for r in store.records("R")) == [1.0, 3.0]
        assert [r.median_ms for r in store.records("R-2")] == [2.0]
        assert {r["run_id"] for r in store.runs()} == {"R", "R-2"}

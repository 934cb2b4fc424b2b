"""A stopped run says how much of it ran: the store keeps the cases a run set out to run, and `show`, `runs`
and the report count against them."""

from __future__ import annotations

import sqlite3

from results_fixtures import cli, synthetic_record

from attnbench.results.merge import merge
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

RUN = "stopped-run"


def _stopped_run(db, planned: int = 12, stored: int = 1, status: str = "interrupted", run_id: str = RUN):
    """A run of ``attnbench run`` that set out to run ``planned`` cases and stored ``stored``."""
    with ResultStore(db) as store:
        store.start_run(run_id, command="attnbench run --device cpu", config={}, env_id=None, version="test")
        store.plan_cases(run_id, planned)
        for s in range(stored):
            spec = AttnSpec(seqlens_q=(64 + s,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")
            store.write(synthetic_record(run_id, spec, "naive", [1.0, 1.1, 0.9]))
        store.finish_run(run_id, status)


def test_show_of_a_stopped_run_counts_its_planned_cases_and_says_how_to_resume(tmp_path):
    db = tmp_path / "r.db"
    _stopped_run(db)
    res = cli("show", "--db", db)
    assert res.returncode == 0, res.stderr
    assert "1 of 12 cases ran" in res.stdout and "1 of 1 cases" not in res.stdout
    assert f"attnbench run --resume {RUN}" in res.stdout and "stopped after 1 of 12 cases; to complete it" in res.stdout
    runs = cli("runs", "--db", db)
    assert runs.returncode == 0 and "1/12" in runs.stdout


def test_a_finished_run_gives_no_resume_hint(tmp_path):
    db = tmp_path / "r.db"
    _stopped_run(db, planned=2, stored=2, status="done")
    res = cli("show", "--db", db)
    assert res.returncode == 0 and "2 of 2 cases ran" in res.stdout and "--resume" not in res.stdout


def test_a_store_without_the_count_opens_and_counts_its_records(tmp_path):
    db = tmp_path / "old.db"
    _stopped_run(db, planned=5, stored=2)
    conn = sqlite3.connect(db)  # back to the layout before the count: version 4, no column
    conn.execute("ALTER TABLE runs DROP COLUMN cases")
    conn.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with ResultStore(db, readonly=True) as store:  # a reader migrates a private copy
        assert store.run(RUN)["cases"] is None
    assert "2 of 2 cases ran" in cli("show", "--db", db).stdout
    with ResultStore(db) as store:  # a writer adds the column
        assert store.schema_version == 5 and store.run(RUN)["cases"] is None


def test_a_run_stores_its_planned_cases(tmp_path):
    db = tmp_path / "r.db"
    res = cli("run", "--device", "cpu", "--q-heads", "2", "--head-size", "16", "--dtype", "fp32", "--warmup", "0",
              "--repeat", "1", "--min-time-ms", "0", "--seq-lens", "17", "--pass", "fwd", "--no-causal",
              "--backends", "naive,sdpa-math", "--no-check", "--db", db)
    assert res.returncode == 0, res.stderr
    with ResultStore(db, readonly=True) as store:
        assert [r["cases"] for r in store.runs()] == [2]


def test_merged_shards_add_up_their_planned_cases(tmp_path):
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "m.db"
    _stopped_run(a, planned=6, stored=1)
    with ResultStore(b) as store:
        store.start_run(RUN, command="attnbench run", config={}, env_id=None, version="test")
        store.plan_cases(RUN, 6)
        spec = AttnSpec(seqlens_q=(99,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")
        store.write(synthetic_record(RUN, spec, "naive", [1.0]))
        store.finish_run(RUN, "interrupted")
    merge(out, [a, b, a])  # the second copy of a adds nothing
    with ResultStore(out, readonly=True) as store:
        assert store.run(RUN)["cases"] == 12

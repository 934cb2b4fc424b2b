"""Long CPU cases: the record of a case abandoned when its run was stopped, which --resume runs again."""

from __future__ import annotations

from reliability_helpers import query

from attnbench.results.record import Record
from attnbench.results.store import ResultStore, record_stop
from attnbench.spec import AttnSpec

SPEC = AttnSpec(seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16")


# ---- the stop ----------------------------------------------------------------------------------------------------
def test_an_abandoned_case_is_stored_once_and_a_resumed_run_runs_it_again(tmp_path):
    db = tmp_path / "r.db"
    done, flight = (Record(run_id="r", backend=name, spec=SPEC, n=1) for name in ("naive", "sdpa-math"))
    abandoned = Record(run_id="r", backend="sdpa-math", spec=SPEC, status="error",
                       reason="abandoned: stopped by SIGTERM after 35 s of the case")
    with ResultStore(db) as store:
        store.start_run("r", command="run", config={}, env_id=None, version="test")
        store.write(done)
    assert record_stop(db, "r", abandoned) and not record_stop(db, "r", abandoned)  # once
    assert not record_stop(db, "r", Record(run_id="r", backend="naive", spec=SPEC, status="error",
                                           reason="abandoned: ..."))  # a case stored meanwhile keeps its record
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    with ResultStore(db) as store:
        assert store.case_ids("r") == {done.case_id, abandoned.case_id}
        store.start_run("r", command="run", config={}, env_id=None, version="test", resume=True)
        assert store.case_ids("r") == {done.case_id}
        store.write(flight)
    assert query(db, "SELECT backend, status FROM records ORDER BY id") == [("naive", "ok"), ("sdpa-math", "ok")]

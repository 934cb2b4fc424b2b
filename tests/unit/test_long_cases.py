"""Long CPU cases: SIGTERM ends a run within a second even inside a long native call (the case in flight
recorded as abandoned, run again by --resume)."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from reliability_helpers import TINY, attnbench, popen, query

from attnbench import interrupt
from attnbench.cli import inflight
from attnbench.results.record import Record
from attnbench.results.store import ResultStore, record_stop
from attnbench.spec import AttnSpec

SPEC = AttnSpec(seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16")


# ---- the stop ----------------------------------------------------------------------------------------------------
def test_the_watcher_runs_only_in_the_command_not_under_the_api():
    assert not inflight.watchable()  # pytest: SIGTERM is not the command's
    previous = signal.signal(signal.SIGTERM, interrupt.stop)
    try:
        assert inflight.watchable()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(inflight.watchable()))
        thread.start()
        thread.join()
        assert seen == [False]  # a program calling the API from a thread of its own
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def _in_native_call(tmp_path, *signals, options=()):
    """`attnbench run` of naive and test-native-wait (60 s in one native call); ``signals`` sent once the run is
    inside that call, 0.3 s apart. (process, seconds from the last signal to its end, stderr, db)."""
    db, mark = tmp_path / "r.db", tmp_path / "in-call"
    proc = popen("run", *TINY, "--seq-lens", "17", "--backends", "naive,test-native-wait", "--db", str(db), *options,
                 ATTNBENCH_TEST_NATIVE_MARK=str(mark))
    deadline = time.time() + 120
    while not mark.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate(timeout=60)
    for i, signum in enumerate(signals):
        time.sleep(0.3 * (i > 0))
        proc.send_signal(signum)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except BaseException:
        proc.kill()
        raise
    return proc, time.monotonic() - sent, err, db


@pytest.mark.parametrize(("signum", "options"), [(signal.SIGTERM, ()), (signal.SIGHUP, ()),
                                                  (signal.SIGTERM, ("--isolate",))],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM-isolated"])
def test_a_stop_signal_inside_a_long_native_call_ends_the_run_within_seconds(tmp_path, signum, options):
    proc, seconds, err, db = _in_native_call(tmp_path, signum, options=options)
    assert seconds < 10, err  # the call has 60 s to go; the handler alone would wait for it
    assert proc.returncode == 128 + signum and "Traceback" not in err, err
    name = signal.Signals(signum).name
    [(run_id, status)] = query(db, "SELECT run_id, status FROM runs")
    assert status == "interrupted"
    rows = query(db, "SELECT backend, status, reason FROM records ORDER BY id")
    assert rows[0] == ("naive", "ok", None)
    assert rows[1][:2] == ("test-native-wait", "error") and rows[1][2].startswith(f"abandoned: stopped by {name} after")
    assert err.splitlines()[-2:] == [
        f"attnbench: aborted; test-native-wait b1 s17 h1 d8 fp32 fwd abandoned after {rows[1][2].split()[-5]} s "
        f"(recorded as an error; --resume runs it again); resume with: attnbench run --resume {run_id} --db {db}",
        f"attnbench: error: stopped by {name}"]
    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet", ATTNBENCH_TEST_NATIVE_S="0")
    assert res.returncode == 0, res.stderr
    assert query(db, "SELECT backend, status FROM records ORDER BY id") == [("naive", "ok"), ("test-native-wait", "ok")]
    assert query(db, "SELECT status FROM runs") == [("done",)]


def test_ctrl_c_inside_a_long_native_call_is_answered_at_once_and_twice_aborts(tmp_path):
    proc, seconds, err, db = _in_native_call(tmp_path, signal.SIGINT, signal.SIGINT)
    assert seconds < 10 and proc.returncode == 130 and "Traceback" not in err, err
    assert err.count("stopping after the case in flight (Ctrl-C again to abort)") == 1, err
    assert err.splitlines()[-1] == "attnbench: error: interrupted"
    rows = query(db, "SELECT backend, status, reason FROM records ORDER BY id")
    assert rows[1][:2] == ("test-native-wait", "error") and rows[1][2].startswith("abandoned: Ctrl-C twice after")

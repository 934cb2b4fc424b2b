"""Ctrl-C stops cleanly after the case in flight; --resume runs exactly the cases still missing."""

import signal
import time

import pytest
from reliability_helpers import TINY, attnbench, env, popen, query

SEQ = ["--seq-lens", "16..45:+1"]  # 30 cases


def wait_for_records(db, n, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if db.exists() and query(db, "SELECT COUNT(*) FROM sqlite_master WHERE name='records'")[0][0]:
            if query(db, "SELECT COUNT(*) FROM records")[0][0] >= n:
                return
        time.sleep(0.05)
    raise AssertionError(f"no {n} records in time; process exit {proc.poll()}")


def test_sigint_stops_after_the_case_in_flight_then_resume_completes(tmp_path):
    db = tmp_path / "r.db"
    proc = popen("run", *TINY, *SEQ, "--backends", "test-sleep", "--db", str(db), ATTNBENCH_TEST_SLEEP_S="0.15")
    wait_for_records(db, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [(run_id, status)] = query(db, "SELECT run_id, status FROM runs")
    assert status == "interrupted"
    done = query(db, "SELECT case_id FROM records")
    assert 3 <= len(done) < 30
    assert f"--resume {run_id}" in err and "interrupted after" in err and "Traceback" not in err
    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet", ATTNBENCH_TEST_SLEEP_S="0.001")
    assert res.returncode == 0, res.stderr
    ids = [r[0] for r in query(db, "SELECT case_id FROM records")]
    assert len(ids) == len(set(ids)) == 30 and set(r[0] for r in done) <= set(ids)
    assert query(db, "SELECT status FROM runs") == [("done",)]
    assert {r[0] for r in query(db, "SELECT seq_len FROM records")} == set(range(16, 46))
    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet")  # nothing left: a no-op
    assert res.returncode == 0 and query(db, "SELECT COUNT(*) FROM records") == [(30,)]


def test_second_sigint_aborts_a_hung_case(tmp_path):
    db = tmp_path / "r.db"
    proc = popen("run", *TINY, "--seq-lens", "17", "--backends", "naive,test-hang", "--db", str(db))
    wait_for_records(db, 1, proc)
    time.sleep(0.3)  # inside the hanging call now
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None  # the first Ctrl-C waits for the case in flight
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    rows = query(db, "SELECT backend, status, reason FROM records")
    assert rows[0] == ("naive", "ok", None)
    assert rows[1][:2] == ("test-hang", "error") and rows[1][2].startswith("abandoned: Ctrl-C twice after")
    assert "--resume" in err and "test-hang b1 s17 h1 d8 fp32 fwd abandoned after" in err and "Traceback" not in err


def test_a_killed_run_is_marked_interrupted_on_the_next_open_and_resume_completes_it(tmp_path):
    db = tmp_path / "r.db"
    proc = popen("run", *TINY, *SEQ, "--backends", "test-sleep", "--db", str(db), ATTNBENCH_TEST_SLEEP_S="0.15")
    wait_for_records(db, 3, proc)
    proc.kill()  # SIGKILL: the process cannot mark its run
    proc.communicate(timeout=60)
    [(run_id, status)] = query(db, "SELECT run_id, status FROM runs")
    assert status == "running"
    listing = attnbench("export", "--db", str(db), "--run", "no-such-run")  # any command that opens the store
    assert listing.returncode == 2 and f"{run_id} (interrupted)" in listing.stderr
    assert query(db, "SELECT status FROM runs") == [("running",)]  # readers show it, and write nothing
    report = attnbench("report", "--db", str(db), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0 and "interrupted" in (tmp_path / "r.html").read_text()
    cmp = attnbench("compare", run_id, run_id, "--db", str(db))
    assert cmp.returncode == 0 and f"note: run {run_id} is interrupted" in cmp.stdout
    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet", ATTNBENCH_TEST_SLEEP_S="0.001")
    assert res.returncode == 0, res.stderr
    assert query(db, "SELECT status FROM runs") == [("done",)]
    assert query(db, "SELECT COUNT(DISTINCT case_id) FROM records") == [(30,)]


def test_a_writer_marks_a_killed_run_interrupted_in_the_file(tmp_path):
    db = tmp_path / "r.db"
    proc = popen("run", *TINY, *SEQ, "--backends", "test-sleep", "--db", str(db), ATTNBENCH_TEST_SLEEP_S="0.15")
    wait_for_records(db, 2, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert query(db, "SELECT status FROM runs") == [("running",)]
    from attnbench.results.store import ResultStore
    ResultStore(db).close()
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]


def test_a_live_run_is_left_running_and_a_reused_pid_is_not_mistaken_for_it():
    import os
    import subprocess
    import sys

    from attnbench.results.store import process_alive, process_started
    me = os.getpid()
    assert process_alive(me, process_started(me))
    assert not process_alive(me, "not-my-start-time") or process_started(me) is None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not process_alive(gone.pid, None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_a_run_like_ctrl_c(tmp_path, signum):
    db = tmp_path / "r.db"
    proc = popen("run", *TINY, *SEQ, "--backends", "test-sleep", "--db", str(db), ATTNBENCH_TEST_SLEEP_S="0.15")
    wait_for_records(db, 2, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    [(run_id, status)] = query(db, "SELECT run_id, status FROM runs")
    assert status == "interrupted" and "Traceback" not in err
    assert f"--resume {run_id}" in err and f"stopped by {signal.Signals(signum).name}" in err
    res = attnbench("run", "--resume", run_id, "--db", str(db), "--quiet", ATTNBENCH_TEST_SLEEP_S="0.001")
    assert res.returncode == 0, res.stderr
    assert query(db, "SELECT COUNT(DISTINCT case_id), COUNT(*) FROM records") == [(30, 30)]


# The signal is sent by the process itself at a named point of its start-up: ``import`` the moment a module's import
# starts (an audit hook), ``c_call`` the moment a C function is called (a profile hook, on while torch.distributed
# imports). The handler records whether it ran inside an import (the import system's frames on the stack).
_AT = (
    "import os, signal, sys\n"
    "from attnbench import entry, interrupt\n"
    "kind, name, signum = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
    "stop = interrupt.stop\n"
    "def recording(sig, frame):\n"
    "    sys.stdout.write(f'handled {\"inside\" if interrupt._importing(frame) else \"outside\"} an import\\n')\n"
    "    stop(sig, frame)\n"
    "entry.stop = recording\n"
    "def profile(frame, event, arg):\n"
    "    if event == 'c_call' and getattr(arg, '__name__', '') == name:\n"
    "        sys.setprofile(None)\n"
    "        os.kill(os.getpid(), signum)\n"
    "def audit(event, args):\n"
    "    if event != 'import' or args[0] in sys.modules:\n"
    "        return\n"
    "    if kind == 'import' and args[0] == name:\n"
    "        os.kill(os.getpid(), signum)\n"
    "    if kind == 'c_call' and args[0] == 'torch.distributed':\n"
    "        sys.setprofile(profile)\n"
    "sys.addaudithook(audit)\n"
    "sys.argv = ['attnbench', 'backends']\n"
    "entry.main()\n"
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(("kind", "name"), [("import", "numpy"), ("c_call", "_c10d_init"),
                                            ("import", "attnbench.backends.base")],
                         ids=["numpy", "c10d-init", "after-the-cli-imported"])
def test_a_signal_while_the_cli_starts_is_one_line(signum, kind, name):
    """Wherever it lands in the start-up (numpy's import, which turns a KeyboardInterrupt into an ImportError;
    torch's C++ ``_c10d_init``, where one aborts the process; an import of the command itself), a stop signal
    ends the command with one line and 128 + the signal. One sent while the CLI imports is handled once that import
    is over; one inside a later import (torch's, which a command makes) is raised again until the command stops."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _AT, kind, name, str(int(signum))], capture_output=True,
                         text=True, timeout=120, env=env())
    assert res.returncode == 128 + signum and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("attnbench: error:"), res.stderr
    handled = [line for line in res.stdout.splitlines() if line.startswith("handled ")]
    assert handled, res.stdout  # and the status and the one line above: the process stopped, it did not abort
    if name == "numpy":  # the CLI's own import: the signal is held back until it is over, handled once
        assert handled == ["handled outside an import"], handled


def test_a_signal_as_the_finished_command_exits_changes_nothing():
    """The command's output is written and its status chosen; a Ctrl-C while the process exits interrupts
    nothing: the exit status is the command's, with no line. In Python's exit functions a handler could still
    answer; in its module teardown (a second or more after an e2e run) Python has put back the default action
    of every signal that has a Python handler, and a Ctrl-C there killed the process (status -2, no line). Only
    a signal ignored stays ignored through it: that is what the stop signals must be once the command is done."""
    import subprocess
    import sys

    code = (
        "import atexit, os, signal, sys, time\n"
        "from attnbench import entry, interrupt\n"
        "def late():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.2)\n"
        "atexit.register(late)\n"
        "sys.argv = ['attnbench', 'presets']\n"
        "try:\n"
        "    entry.main()\n"
        "finally:\n"
        "    print('after:', [signal.getsignal(s) == signal.SIG_IGN for s in interrupt.STOP_SIGNALS])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env())
    assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr)
    assert "qwen3-next-80b" in res.stdout  # the command ran to its end
    assert "after: [True, True, True]" in res.stdout, res.stdout  # ignored: through Python's teardown too


def test_a_signal_python_cannot_raise_still_stops_with_one_line():
    """A stop signal that lands in a weakref callback of the import system (or a ``__del__``) is an exception
    Python only reports ("Exception ignored ...", with a traceback) before going on: the command stops instead."""
    import subprocess
    import sys

    code = (
        "import signal, sys\n"
        "from attnbench import entry\n"
        "sys.unraisablehook = entry._unraisable\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        entry.stop(signal.SIGTERM, None)\n"
        "Finalized()\n"
        "print('went on')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env())
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert res.stderr == "attnbench: error: stopped by SIGTERM\n" and "went on" not in res.stdout

"""Long CPU cases: a sweep of minutes is announced before it starts, a long case shows its progress while it runs,
and SIGTERM ends a run within a second even inside a long native call (the case in flight recorded as abandoned,
run again by --resume)."""

from __future__ import annotations

import io
import signal
import threading
import time

import pytest
from reliability_helpers import TINY, attnbench, popen, query
from rich.console import Console

from attnbench import interrupt
from attnbench.cli import common, inflight
from attnbench.cli.run import _LogLines
from attnbench.results.record import Record
from attnbench.results.store import ResultStore, record_stop
from attnbench.spec import AttnSpec
from attnbench.timing import estimate
from attnbench.timing.config import TimingConfig
from attnbench.timing.cpu import time_cpu

RATES = estimate.Rates(flops={"bf16": 100e9}, fresh_bytes=2e9, threads=1)
SPEC = AttnSpec(seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16")


# ---- the estimate ------------------------------------------------------------------------------------------------
def test_a_long_call_is_made_14_times_and_a_short_one_until_the_time_cap():
    timing = TimingConfig()  # 10 warm-up calls, 100 samples, 100 ms to 1 s of samples on a CPU
    assert estimate.calls(2.0, timing, check=True) == 14  # checked, 1 warm-up, 10 samples, 2 after the timing
    assert estimate.calls(2.0, timing, check=False) == 12
    assert estimate.calls(0.001, timing, check=True) == 1 + 10 + 100 + 2  # the repeat count
    assert estimate.calls(0.02, timing, check=True) == 1 + 10 + 50 + 2  # the 1 s cap


def test_the_calls_counted_are_those_the_cpu_timing_makes():
    timing = TimingConfig(max_time_ms=200.0)
    made = []

    def call():
        made.append(1)
        time.sleep(0.02)
    time_cpu(call, timing)
    expected = estimate.calls(0.02, timing, check=False) - 1  # less the call prepare checks
    assert abs(len(made) - expected) <= 2, (len(made), expected)


def test_a_call_takes_the_longer_of_its_flops_and_the_bytes_plain_math_writes():
    prefill = AttnSpec(seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16")
    flops_s = 4 * 8 * 1024**2 * 128 / 100e9
    assert estimate.call_seconds(prefill, RATES) == pytest.approx(flops_s)
    decode = AttnSpec(batch=4, seqlens_q=(1,), seqlens_k=(1024,), heads_q=128, heads_kv=1, head_dim=576,
                      head_dim_v=512, dtype="bf16", mla=True)  # DeepSeek-V3's: one latent KV head for 128
    repeated = 2 * 4 * 128 * 1024 * (576 + 512 + 2) * 2  # keys, values and scores of every head, written and read
    assert estimate.call_seconds(decode, RATES) == pytest.approx(repeated / 2e9)
    assert estimate.call_seconds(decode.replace(dtype="fp16"), RATES) is None  # a dtype not probed
    assert estimate.call_seconds(prefill.replace(pass_="fwd_bwd"), RATES) == pytest.approx(3.5 * flops_s)


def test_only_a_sweep_of_minutes_is_announced_with_what_the_estimate_rests_on():
    short = estimate.sweep([AttnSpec(seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16")] * 3, RATES,
                           TimingConfig(), check=True)
    assert short.cases == 3 and estimate.warning(short) is None
    long = estimate.sweep([AttnSpec(seqlens_q=(16384,), heads_q=8, head_dim=128, dtype="bf16")] * 3, RATES,
                          TimingConfig(), check=True)
    line = estimate.warning(long)
    per_call = 4 * 8 * 16384**2 * 128 / 100e9
    assert long.seconds == pytest.approx(3 * 14 * per_call)
    assert line.startswith(f"attnbench: this sweep may take {estimate.span(long.seconds, 4 * long.seconds)} on this "
                           "CPU: 3 cases, ~42 calls")
    for words in ("bf16 100 GFLOP/s", "fresh memory 2 GB/s", "1 thread", "up to 4x slower", "--seq-lens",
                  "Ctrl-C stops it"):
        assert words in line


@pytest.mark.parametrize(("low", "high", "shown"), [(0.2, 0.8, "up to 1 s"), (2, 8, "2–8 s"), (30, 120, "30 s–2 min"),
                                                    (60, 240, "1–4 min"), (5000, 20000, "1.4–5.6 h")])
def test_ranges_read_in_one_unit(low, high, shown):
    assert estimate.span(low, high) == shown


def test_the_probe_times_each_dtype_with_the_run_threads_and_skips_one_the_cpu_cannot_compute():
    import torch
    rates = estimate.probe(["fp32", "fp8"])
    assert set(rates.flops) == {"fp32"} and rates.flops["fp32"] > 0 and rates.fresh_bytes > 0
    assert rates.threads == torch.get_num_threads()


# ---- a GPU's work on a CPU: refused before it starts ------------------------------------------------------------
SLOW = estimate.Rates(flops={"fp32": 50e9, "bf16": 100e9}, fresh_bytes=2e9, threads=1)
"""A 2-core CPU's rates, fixed: what the CLI tests below are refused or let through at, on any machine."""


def _slow_cpu(monkeypatch):
    monkeypatch.setattr(estimate, "probe", lambda dtypes: SLOW)


@pytest.mark.parametrize("op", ["gdn", "kda", "mamba2", "sparse-mla", "indexer"])
def test_every_operator_has_a_cpu_estimate_at_its_cpu_default_and_its_preset(op):
    import attnbench
    from attnbench import operators
    [spec, *_] = attnbench.plan(op=op, device="cpu").specs
    call_s = estimate.call_seconds(spec, SLOW)
    assert call_s is not None and call_s > 0
    op_decl = operators.of(spec)
    assert call_s >= op_decl.flops(spec) / (100e9 * op_decl.cpu_share) * 0.99  # its own FLOPs at its share
    default = estimate.sweep(attnbench.plan(op=op, device="cpu").specs * 2, SLOW, TimingConfig(), check=True)
    assert estimate.refusal(default) is None  # the CPU default shape runs without asking


def test_the_default_cpu_sweep_is_never_refused_even_at_the_slowest_rates():
    import attnbench
    specs = attnbench.plan(device="cpu").specs
    slowest = estimate.Rates(flops={"fp32": 5e9}, fresh_bytes=0.5e9, threads=1)  # a 10x slower CPU than SLOW
    assert estimate.refusal(estimate.sweep(specs * 3, slowest, TimingConfig(), check=True)) is None


@pytest.mark.parametrize("argv", [["--preset", "qwen3-next-80b", "--seq-lens", "4k", "16k"],
                                  ["--preset", "deepseek-v3.2-sparse-prefill"],
                                  ["--preset", "qwen3.5-gdn", "--seq-lens", "4k", "32k"]],
                         ids=["gated-attention", "sparse-mla", "gdn"])
def test_a_gpu_sized_command_is_refused_on_a_cpu_in_one_line_and_stores_nothing(tmp_path, monkeypatch, argv):
    from results_fixtures import cli

    from attnbench.cli import run as run_cmd
    _slow_cpu(monkeypatch)
    started = []
    monkeypatch.setattr(run_cmd.control, "make_runner", _wrapping(run_cmd.control.make_runner,
                                                                  lambda self, specs: started.append(1) or []))
    db = tmp_path / "r.db"
    res = cli("run", *argv, "--device", "cpu", "--db", db)
    assert not started  # (before the refusal, hours of it ran here)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("attnbench: error: a GPU-sized command: ") and line.endswith(
        " on this CPU; --allow-long runs it") and len(line) <= 100, line
    assert " h " in line or " min" in line  # what it would cost here
    assert not db.exists()  # refused before the store is touched


def test_allow_long_starts_it_and_the_estimate_counts_the_cases_the_progress_counts(tmp_path, monkeypatch):
    """The warning counts the cases that will run (a backend takes them, the memory guard lets them start) out of
    the run's cases, the number the progress shows."""
    from results_fixtures import cli

    from attnbench import memory
    from attnbench.cli import run as run_cmd
    monkeypatch.setattr(estimate, "probe", lambda dtypes: estimate.Rates(flops={"fp32": 1e9}, fresh_bytes=1e9,
                                                                         threads=1))
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 600 << 20)  # 4k's 256 MiB scores fit, 8k's do not
    seen = []

    def stop(self, specs):  # the estimate and the progress are made; nothing need run
        seen.append(len(self.cases(specs)))
        return []
    monkeypatch.setattr(run_cmd.control, "make_runner", _wrapping(run_cmd.control.make_runner, stop))
    argv = ["run", "--device", "cpu", "--seq-lens", "4k", "8k", "--q-heads", "4", "--head-size", "64", "--dtype",
            "fp32", "--pass", "fwd", "--no-causal", "--backends", "naive,sdpa-math,sdpa-flash", "--db",
            tmp_path / "r.db"]
    refused = cli(*argv)
    assert refused.returncode == 2 and "GPU-sized command: 24–96 min on this CPU" in refused.stderr, refused.stderr
    # 4k's three only: 8k's are refused as too large, not counted (with them, 2-8 h)
    res = cli(*argv, "--allow-long")  # exit 130: the stand-in run above stops before the first case
    assert seen == [6], res.stderr
    assert "this sweep may take" in res.stderr and ": 3 of its 6 cases, ~" in res.stderr, res.stderr


def _wrapping(make_runner, run):
    def made(plan, **kwargs):
        runner = make_runner(plan, **kwargs)
        runner.run = run.__get__(runner)
        return runner
    return made


def test_a_sweep_none_of_whose_cases_fits_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from results_fixtures import cli

    from attnbench import memory
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 600 << 20)
    db = tmp_path / "r.db"
    res = cli("run", "--device", "cpu", "--seq-lens", "8k", "16k", "--q-heads", "4", "--head-size", "64", "--dtype",
              "fp32", "--pass", "fwd", "--no-causal", "--backends", "naive,sdpa-math", "--db", db)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("attnbench: error: a GPU-sized command: the smallest of its 4 cases needs "), line
    assert "600.0 MiB free" in line and not db.exists()


# ---- progress while a case runs ----------------------------------------------------------------------------------
def test_a_case_in_flight_beats_with_its_time_and_estimate_then_the_pace_of_the_run():
    flight = inflight.InFlight(expected_s=lambda spec: 10.0)
    beats = []
    with inflight.heartbeat(flight, lambda *beat: beats.append(beat), after_s=0.05, tick_s=0.01):
        time.sleep(0.1)
        assert beats == []  # no case in flight
        flight.start(SPEC, "naive")
        deadline = time.time() + 30
        while not beats and time.time() < deadline:
            time.sleep(0.01)
    what, elapsed, expected = beats[0]
    assert what == "naive b1 s1024 h8 d128 bf16 fwd" and elapsed >= 0.05 and expected == "10–40 s"
    flight.started -= 20  # the case took 20 s against its 10 estimated: the run's pace is twice the estimate
    flight.stored(Record(run_id="r", backend="naive", spec=SPEC, n=10))
    assert flight.running() is None and flight.expected(SPEC) == "~20 s"
    quick = inflight.InFlight(expected_s=lambda spec: 0.01)
    quick.start(SPEC, "naive")
    quick.stored(Record(run_id="r", backend="naive", spec=SPEC, n=10))
    assert quick.expected(SPEC) == "<1 s"  # not '~<1 s'
    assert inflight.InFlight().expected(SPEC) is None  # no estimate (a GPU run): the elapsed time alone


def test_a_log_gets_a_still_running_line_every_5_s(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=100))
    lines = _LogLines(quiet=False)
    lines.add_task("measuring", total=3)
    lines.update(0, description="naive b1 s1024 h8 d128 bf16 fwd")
    lines.still_running("naive b1 s1024 h8 d128 bf16 fwd", 6.2, "10–40 s")  # a line 5 s after the last only
    lines.last -= 5
    lines.still_running("naive b1 s1024 h8 d128 bf16 fwd", 11.4, "10–40 s")
    log = out.getvalue().splitlines()
    assert len(log) == 2
    assert log[1].startswith("attnbench: [0/3] ") and log[1].endswith(
        "s still running naive b1 s1024 h8 d128 bf16 fwd (11 s, est. 10–40 s)")


def test_a_long_run_in_a_log_spaces_its_lines_out(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=100))
    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    lines = _LogLines(quiet=False)
    lines.add_task("measuring", total=7200)
    for _ in range(7200):  # two hours of one-second cases
        lines.update(0, description="naive b1 s1024 h8 d128 bf16 fwd")
        lines.advance(0)
        clock[0] += 1.0
    log = out.getvalue().splitlines()
    seconds = [int(line.split()[2].rstrip("s")) for line in log]
    assert seconds[:3] == [0, 5, 10]  # the start as before: a line every 5 s
    assert 100 < len(log) < 200  # not 1,440 lines
    gaps = [b - a for a, b in zip(seconds, seconds[1:], strict=False)]
    assert max(gaps) == 60 and gaps == sorted(gaps)  # longer waits as the run goes on, at most a minute


def test_a_log_line_of_a_long_case_name_fits_the_logs_width(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=100))
    lines = _LogLines(quiet=False)
    lines.add_task("measuring", total=2)
    what = "torch-recurrent gdn b1 s2048 h16 k128 v128 bf16 h0 l2 fwd"
    lines.update(0, description=what)
    lines.last -= 5
    lines.still_running(what, 15.2, "11–45 s")  # 113 columns whole
    first, beat = out.getvalue().splitlines()
    assert first == f"attnbench: [0/2] 0s {what}"  # short enough: whole
    assert len(beat) == 100 and beat.startswith("attnbench: [0/2] ") and beat.endswith("… (15 s, est. 11–45 s)")
    assert "still running torch-recurrent gdn b1 s2048" in beat


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

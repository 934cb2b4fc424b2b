"""CPU timing on a shared machine: the thread count a run chooses, preempted samples, retiming and the mark.

The machine's real load never decides a test: the counters the timer reads are replaced by scripted ones.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from attnbench.results.record import busy_of
from attnbench.timing import Measurement, TimingConfig, cpu_load
from attnbench.timing import case as case_mod
from attnbench.timing.cpu import time_cpu


@pytest.mark.parametrize(("cores", "others", "most", "want"), [
    (2, 0.96, 2, 1),   # one core kept busy elsewhere: one thread
    (2, 0.3, 2, 2),    # background noise takes no core
    (2, None, 2, 2),   # not measured (not Linux): every core
    (4, 2.5, 4, 2),
    (1, 3.0, 1, 1),    # never fewer than one
    (8, 0.0, 3, 3),    # never more than torch would use (OMP_NUM_THREADS)
])
def test_threads_get_a_core_each(cores, others, most, want):
    assert cpu_load.threads_for(cores, others, most) == want


def test_a_given_thread_count_is_kept_and_the_cores_are_counted():
    plan = cpu_load.plan(3)
    assert plan.threads == 3 and plan.given and plan.others is None
    assert 1 <= plan.cores <= (torch.get_num_threads() + 1024)


@pytest.mark.parametrize(("cpu", "busy"), [
    ({"samples": 100, "preempted": 40, "waited_ms": 10.0, "measured_ms": 100.0}, True),
    ({"samples": 100, "preempted": 40, "waited_ms": 0.5, "measured_ms": 100.0}, False),   # switched out, cost nothing
    ({"samples": 100, "preempted": 10, "waited_ms": 45.0, "measured_ms": 100.0}, True),   # few samples, long waits
    ({"samples": 100, "preempted": 10, "waited_ms": 5.0, "measured_ms": 100.0}, False),
    ({"samples": 100, "preempted": 30, "waited_ms": None, "measured_ms": 100.0}, True),   # no schedstat
    ({"samples": 1, "preempted": 1, "waited_ms": 5.0, "measured_ms": 5.0}, False),        # verify's one call
    ({"samples": 3, "preempted": 3, "waited_ms": 50.0, "measured_ms": 100.0}, True),      # an e2e run's 3 steps
    ({"samples": 100, "preempted": None}, False),                                         # not counted here
    (None, False),
])
def test_what_counts_as_a_busy_cpu(cpu, busy):
    assert cpu_load.is_busy(cpu) is busy


def _scripted(monkeypatch, *, switch_every_call: bool, wait_per_read: float, others_jiffies: int = 0):
    """Counters that say every sample was (or none was) switched out, how long the threads waited, and how many
    jiffies other processes ran between two looks at /proc/stat."""
    ticks = itertools.count()
    monkeypatch.setattr(cpu_load, "involuntary_switches", (lambda: next(ticks)) if switch_every_call else (lambda: 7))
    delays = itertools.count(step=wait_per_read)
    monkeypatch.setattr(cpu_load, "run_delay_ms", lambda: next(delays))
    looks = itertools.count(step=others_jiffies)
    monkeypatch.setattr(cpu_load, "_busy_jiffies", lambda: (next(looks), 0))


def test_the_cpu_timer_counts_preempted_samples_and_the_wait(monkeypatch):
    _scripted(monkeypatch, switch_every_call=True, wait_per_read=1000.0)
    samples, info = time_cpu(lambda: sum(range(100)), TimingConfig(warmup=0, repeat=20, min_time_ms=0.0))
    cpu = info["cpu"]
    assert cpu["samples"] == len(samples) == cpu["preempted"] and cpu["waited_ms"] == 1000.0
    assert cpu["threads"] == torch.get_num_threads() and cpu["busy"] is True
    _scripted(monkeypatch, switch_every_call=False, wait_per_read=0.0)
    _, info = time_cpu(lambda: sum(range(100)), TimingConfig(warmup=0, repeat=20, min_time_ms=0.0))
    assert info["cpu"]["preempted"] == 0 and info["cpu"]["busy"] is False


def test_other_processes_using_a_core_mark_the_case_without_preempting_it(monkeypatch):
    # a busy loop on the other core of two never preempts a one-thread kernel, yet runs against each other then
    # moved up to 20%: CPU time used elsewhere while the samples are taken marks the case too
    _scripted(monkeypatch, switch_every_call=False, wait_per_read=0.0, others_jiffies=100_000)
    nap = TimingConfig(warmup=0, repeat=10, min_time_ms=0.0)  # ten samples of 6 ms: long enough to judge
    samples, info = time_cpu(lambda: time.sleep(0.006), nap)
    assert info["cpu"]["preempted"] == 0 and info["cpu"]["others"] > cpu_load.BUSY_CORE and info["cpu"]["busy"]
    assert not cpu_load.was_preempted(info["cpu"])  # so it is not timed again: that would not help
    _scripted(monkeypatch, switch_every_call=False, wait_per_read=0.0, others_jiffies=0)
    _, info = time_cpu(lambda: time.sleep(0.006), nap)
    assert info["cpu"]["others"] == 0.0 and not info["cpu"]["busy"]


def _cpu_info(hit: int, n: int = 20, waited: float = 50.0) -> dict:
    cpu = {"threads": 2, "samples": n, "preempted": hit, "waited_ms": waited, "measured_ms": 100.0}
    return {"cpu": cpu | {"busy": cpu_load.is_busy(cpu)}}


def _settle(monkeypatch, *measurements, lowered=(2, 2)):
    draws = iter(measurements)
    monkeypatch.setattr(case_mod, "measure_detailed", lambda fns, config, device: next(draws))
    monkeypatch.setattr(cpu_load, "relieve", lambda: lowered)
    ctx = case_mod.CaseContext(config=TimingConfig(), device=torch.device("cpu"))
    return case_mod._measure_settled(lambda: None, ctx)


def test_a_busy_case_is_timed_again_with_fewer_threads_and_the_calmer_timing_kept(monkeypatch):
    busy = Measurement([8.0] * 20, _cpu_info(hit=20))
    calm = Measurement([0.2] * 20, _cpu_info(hit=0, waited=0.0))
    samples, info = _settle(monkeypatch, busy, calm, lowered=(2, 1))
    assert samples == calm.samples_ms and not busy_of(info)
    assert info["cpu"]["retimed"] == {"first_median_ms": 8.0, "first_preempted": "20/20", "kept": "second",
                                      "threads_lowered_from": 2}
    samples, info = _settle(monkeypatch, busy, Measurement([9.0] * 20, _cpu_info(hit=20, waited=90.0)))
    assert samples == busy.samples_ms and busy_of(info)  # still busy: the first kept, and marked
    assert info["cpu"]["retimed"]["kept"] == "first" and "threads_lowered_from" not in info["cpu"]["retimed"]
    samples, info = _settle(monkeypatch, calm)  # a calm case is timed once
    assert samples == calm.samples_ms and "retimed" not in info["cpu"]


def test_a_cpu_run_times_with_the_threads_it_chose(tmp_path):
    from attnbench.runner import Runner, RunOptions
    before = torch.get_num_threads()
    try:
        options = RunOptions(device="cpu", backends=("naive",), cpu=cpu_load.CpuPlan(threads=1, cores=2, others=0.9))
        runner = Runner(options, run_id="r", env_id=None, sink=lambda r: None)
        assert torch.get_num_threads() == 1
        from attnbench.inputs import make_inputs
        from attnbench.spec import AttnSpec
        spec = AttnSpec(batch=1, seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd")
        record = runner.run_case(spec, runner.backends[0], make_inputs(spec, "cpu", 0))
        assert record.info["cpu"]["threads"] == 1 and record.info["cpu"]["cores"] == 2
        assert record.info["cpu"]["others_at_start"] == 0.9
    finally:
        torch.set_num_threads(before)

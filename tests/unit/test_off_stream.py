"""The rule that marks a kernel leaving work running off the timed stream (timing/streams.py), with fake
timings; the GPU side (a kernel on a side stream) is tests/gpu/test_off_stream_gpu.py."""

import math

import pytest

from attnbench import plausibility
from attnbench.plausibility import Ceilings
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig, streams

LIMITS = Ceilings(tflops=1000.0, gbps=4000.0, source="test")


@pytest.mark.parametrize(("wall_ms", "stream_ms", "marked"), [
    (10.04, 10.0, False),    # launch and synchronize latency: well-behaved
    (300.0, 10.0, True),     # the device busy long after the current stream was done
    (12.5, 10.0, False),     # a 2.5 ms hiccup in a 12.5 ms batch: under a quarter
    (13.4, 10.0, True),      # 3.4 ms of 13.4: over a quarter
    (0.9, 0.0, False),       # under OUTSIDE_MIN_MS, however large a share
    (2.0, 0.5, True),
    (5.0, 6.0, False),       # stream time above the wall time (clock skew): nothing outside
])
def test_the_rule(wall_ms, stream_ms, marked):
    assert streams.left_running(wall_ms, stream_ms) is marked


def test_the_rule_at_its_thresholds():
    wall = 100.0
    at_share = wall - streams.OUTSIDE_SHARE * wall
    assert not streams.left_running(wall, at_share)
    assert streams.left_running(wall, at_share - 0.01)
    assert not streams.left_running(streams.OUTSIDE_MIN_MS, 0.0)


def test_batch_size_follows_the_median():
    assert streams.calls_for(1.0) == math.ceil(streams.BATCH_MS / 1.0)
    assert streams.calls_for(1e-4) == streams.MAX_CALLS
    assert streams.calls_for(500.0) == 1
    assert streams.calls_for(0.0) == streams.MAX_CALLS and streams.calls_for(math.nan) == streams.MAX_CALLS


class FakeBatches:
    """Hands out (wall_ms, stream_ms) pairs in order and counts the batches asked for."""

    def __init__(self, *timings):
        self.timings, self.calls = list(timings), []

    def __call__(self, fn, calls, device):
        self.calls.append(calls)
        return self.timings.pop(0)


def test_a_well_behaved_case_costs_one_batch():
    fake = FakeBatches((10.05, 10.0))
    info = streams.check(lambda: None, "cuda", median_ms=0.5, batch=fake)
    assert fake.calls == [20]
    assert info == {"calls": 20, "wall_ms": 10.05, "stream_ms": 10.0, "outside_ms": 0.05, "left_running": False}
    assert streams.reason({"off_stream": info}) is None


def test_a_case_is_marked_only_when_a_second_batch_agrees():
    once = FakeBatches((40.0, 10.0), (10.1, 10.0))  # a preempted host thread in the first batch
    info = streams.check(lambda: None, "cuda", median_ms=0.5, batch=once)
    assert len(once.calls) == 2 and info["left_running"] is False
    assert info["outside_ms"] == pytest.approx(0.1)  # the smaller of the two is kept
    twice = FakeBatches((300.0, 10.0), (290.0, 10.0))
    info = streams.check(lambda: None, "cuda", median_ms=0.5, batch=twice)
    assert info["left_running"] is True and info["outside_ms"] == pytest.approx(280.0)
    why = streams.reason({"off_stream": info})
    assert "280 ms of 290 ms" in why and "another stream" in why


def test_plausibility_marks_work_left_running_before_any_ceiling():
    marked = {"off_stream": {"calls": 200, "wall_ms": 290.0, "stream_ms": 10.0, "outside_ms": 280.0,
                             "left_running": True}}
    # a possible throughput: the mark alone makes it implausible
    assert "another stream" in plausibility.check(tflops=10, gbps=10, info=marked, exact=True, cold_l2=True,
                                                  limits=LIMITS)
    # an impossible one too: the reason names the stream, the cause, not the ceiling
    assert "another stream" in plausibility.check(tflops=1e6, gbps=10, info=marked, exact=True, cold_l2=True,
                                                  limits=LIMITS)
    fine = {"off_stream": dict(marked["off_stream"], left_running=False)}
    assert plausibility.check(tflops=10, gbps=10, info=fine, exact=True, cold_l2=True, limits=LIMITS) is None


def test_the_runner_records_a_marked_case_as_implausible(monkeypatch):
    # the check itself needs a GPU; here the timing is the CPU's and its report is made to say "marked"
    import attnbench.runner as runner_module
    timed = runner_module.time_prepared

    def marked(*args, **kwargs):
        samples, info = timed(*args, **kwargs)
        info["off_stream"] = {"calls": 10, "wall_ms": 50.0, "stream_ms": 1.0, "outside_ms": 49.0,
                              "left_running": True}
        return samples, info
    monkeypatch.setattr(runner_module, "time_prepared", marked)
    spec = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16, dtype="fp32")
    runner = Runner(RunOptions(device="cpu", backends=("naive",), timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="t", env_id=None, sink=lambda r: None)
    (record,) = runner.run([spec])
    assert record.status == "implausible" and "another stream" in record.reason
    assert record.tflops is None and record.median_ms is not None


def test_no_stream_check_on_a_cpu():
    spec = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16, dtype="fp32")
    runner = Runner(RunOptions(device="cpu", backends=("naive",), timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="t", env_id=None, sink=lambda r: None)
    (record,) = runner.run([spec])
    assert record.status == "ok" and "off_stream" not in record.info


class _SharedGpu:
    """A simulated device shared with another process: the batch's start event waits ``slice_ms`` for the other
    process's time slice; each call is 1 ms of device work. Stands in for torch.cuda and the host clock."""

    def __init__(self, slice_ms: float):
        self.now = 0.0  # host time, ms
        self.busy_until = 0.0  # device time its queue reaches, ms
        self.slice_ms = slice_ms
        self.events = 0

    def perf_counter(self):
        return self.now / 1e3

    def synchronize(self, device=None):
        self.now = max(self.now, self.busy_until)

    def call(self):
        self.busy_until = max(self.busy_until, self.now) + 1.0
        self.now += 0.01  # the launch

    def event(self, enable_timing=True):
        gpu = self

        class Event:
            def record(self):
                wait = gpu.slice_ms if gpu.events == 0 else 0.0
                gpu.events += 1
                self.at = gpu.busy_until = max(gpu.busy_until, gpu.now) + wait

            def synchronize(self):
                gpu.now = max(gpu.now, self.at)

            def elapsed_time(self, end):
                return end.at - self.at
        return Event()


def test_a_time_slice_of_another_process_before_the_batch_is_not_work_off_the_stream(monkeypatch):
    import contextlib

    import torch
    gpu = _SharedGpu(slice_ms=5.0)
    monkeypatch.setattr(streams.time, "perf_counter", gpu.perf_counter)
    monkeypatch.setattr(torch.cuda, "Event", gpu.event)
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    wall_ms, stream_ms = streams.time_batch(gpu.call, 10, "cuda")
    assert stream_ms == pytest.approx(10.0, abs=0.2)
    assert streams.outside(wall_ms, stream_ms) < 0.1  # counted from the queueing it would be 5 ms: marked
    assert not streams.left_running(wall_ms, stream_ms) and streams.left_running(wall_ms + 5.0, stream_ms)

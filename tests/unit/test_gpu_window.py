"""What the GPU did while a case was timed: the sampler across the timed calls, its summary, the clock-drop mark
it feeds, and the host's cost per call; all driven by fake sensors and clocks, so nothing here depends on the
machine's speed."""

import itertools
import threading
import types

import pytest
import torch

from attnbench.timing import Measurement, TimingConfig, clocks
from attnbench.timing import case as case_mod
from attnbench.timing.events import launch_info


def reading(clock, power=None, temp=None):
    return {"sm_clock_mhz": clock, "power_w": power, "temperature_c": temp}


def test_the_summary_covers_only_the_timed_calls_where_readings_fell_in_them():
    readings = [(0.0, reading(1980, 300.0, 40)),   # before the timed calls: the warm-up at the boost clock
                (1.0, reading(1755, 650.0, 61)), (2.0, reading(1650, 699.0, 64)), (3.0, reading(1700, 690.0, 63)),
                (9.0, reading(1980, 200.0, 55))]   # after them
    got = clocks.window_summary(readings, (0.5, 3.5), source="nvml", interval_ms=20.0)
    assert got["sm_clock_mhz"] == {"min": 1650.0, "median": 1700.0, "max": 1755.0}
    assert got["power_w"] == {"min": 650.0, "median": 690.0, "max": 699.0}
    assert got["temperature_c"]["max"] == 64.0
    assert got["samples"] == 3 and got["over"] == "timed calls" and got["source"] == "nvml"
    assert got["interval_ms"] == 20.0


def test_a_window_shorter_than_the_interval_falls_back_to_the_whole_case_and_says_so():
    readings = [(0.0, reading(1980)), (1.0, reading(1900, 500.0))]
    got = clocks.window_summary(readings, (0.2, 0.3))
    assert got["over"] == "case" and got["samples"] == 2
    assert got["sm_clock_mhz"]["median"] == 1940.0
    assert got["power_w"] == {"min": 500.0, "median": 500.0, "max": 500.0}  # a missing value is skipped
    assert "temperature_c" not in got and "source" not in got
    assert clocks.window_summary(readings, None)["over"] == "case"


def test_no_reading_or_no_value_is_no_summary():
    assert clocks.window_summary([]) == {}
    assert clocks.window_summary([(0.0, {}), (1.0, reading(None))], (0.0, 2.0)) == {}


class Ticks:
    """A clock that moves one second a read, whatever the machine does."""

    def __init__(self):
        self.now = itertools.count()

    def __call__(self):
        return float(next(self.now))


def test_the_sampler_reads_in_its_thread_until_stopped():
    three = threading.Event()
    values = itertools.count(1000, 100)

    def read():
        value = next(values)
        if value >= 1200:
            three.set()
        return reading(value)

    sampler = clocks.WindowSampler(read, interval_ms=1.0, source="fake", clock=Ticks())
    sampler.start()
    assert three.wait(60)
    readings = sampler.stop()
    count = len(readings)
    assert count >= 3 and [r["sm_clock_mhz"] for _, r in readings[:3]] == [1000, 1100, 1200]
    assert [t for t, _ in readings] == [float(i) for i in range(count)]
    assert sampler.stop() == readings and len(readings) == count  # stopped: nothing more is read


def test_a_failing_sensor_ends_the_sampling_quietly():
    calls = itertools.count()

    def read():
        if next(calls) == 2:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return reading(1980)

    sampler = clocks.WindowSampler(read, interval_ms=1.0, clock=Ticks()).start()
    sampler._thread.join(60)  # the thread ends by itself at the failing read
    assert not sampler._thread.is_alive()
    assert len(sampler.stop()) == 2
    with pytest.raises(ValueError, match="interval_ms"):
        clocks.WindowSampler(read, interval_ms=0)


def test_no_sampler_on_a_cpu():
    assert clocks.ClockMonitor("cpu").reader() is None
    assert case_mod.window_sampler(clocks.ClockMonitor("cpu")) is None


def _on_a_fake_gpu(monkeypatch, nvml):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(clocks, "_pynvml", lambda: nvml)
    monkeypatch.setattr(clocks, "device_uuid", lambda device: "GPU-abc")
    monitor = clocks.ClockMonitor("cpu")
    monitor.device, monitor.enabled = torch.device("cuda"), nvml is not None
    return monitor


def test_the_reader_is_nvml_else_torchs_wrappers_else_none(monkeypatch):
    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, nvmlDeviceGetHandleByUUID=lambda uuid: ("h", uuid),
        nvmlDeviceGetClockInfo=lambda h, kind: 1755, nvmlDeviceGetTemperature=lambda h, kind: 63,
        nvmlDeviceGetPowerUsage=lambda h: 650_000)
    read, source = _on_a_fake_gpu(monkeypatch, nvml).reader()
    assert source == "nvml" and read() == reading(1755, 650.0, 63)

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "clock_rate", lambda i: 1650)
    monkeypatch.setattr(torch.cuda, "power_draw", lambda i: 700_000)  # mW through NVML
    monkeypatch.setattr(torch.cuda, "temperature", lambda i: 70)
    read, source = _on_a_fake_gpu(monkeypatch, None).reader()
    assert source == "torch" and read() == reading(1650, 700.0, 70)

    def missing(i):
        raise ModuleNotFoundError("pynvml")
    monkeypatch.setattr(torch.cuda, "power_draw", missing)
    assert _on_a_fake_gpu(monkeypatch, None).reader() is None


def test_a_fall_anywhere_in_the_window_marks_the_clock_dropped():
    start, end = reading(1980), reading(1950)
    fell = {"sm_clock_mhz": {"min": 1650.0, "median": 1800.0, "max": 1980.0}, "samples": 5}
    held = {"sm_clock_mhz": {"min": 1900.0, "median": 1950.0, "max": 1980.0}, "samples": 5}
    got = case_mod.gpu_state(start, end, fell)
    assert got["clock_dropped"] and got["gpu_state"] == {"start": start, "end": end, "window": fell}
    assert "clock_dropped" not in case_mod.gpu_state(start, end, held)
    assert case_mod.gpu_state(start, reading(1700), {})["clock_dropped"]  # the end alone, as before
    assert case_mod.gpu_state({}, {}, {}) == {}


class FakeSampler:
    """Stands for the sampler: the readings a GPU would have given, at the perf_counter seconds given."""

    source, interval_ms = "nvml", 20.0

    def __init__(self, readings):
        self.readings, self.started = readings, False

    def start(self):
        self.started = True

    def stop(self):
        return self.readings


def test_a_timed_case_records_the_window_of_its_timed_calls(monkeypatch):
    sampler = FakeSampler([(1.0, reading(1980, 250.0, 40)), (10.5, reading(1700, 690.0, 60)),
                           (11.5, reading(1650, 700.0, 62)), (30.0, reading(1980, 100.0, 50))])
    monitor = types.SimpleNamespace(sample=iter([reading(1980), reading(1900)]).__next__)
    monkeypatch.setattr(case_mod, "window_sampler", lambda clocks: sampler)
    timed = {"timed_s": [10.0, 12.0], "launch": {"host_ms": 0.02, "host_bound": False}}
    monkeypatch.setattr(case_mod, "measure_detailed", lambda fn, config, device: Measurement([1.0] * 20, dict(timed)))
    ctx = case_mod.CaseContext(config=TimingConfig(), device=torch.device("cpu"))
    prepared = types.SimpleNamespace(fn=lambda: None, side={})
    spec, backend = types.SimpleNamespace(label=lambda: "s77", pass_="fwd"), types.SimpleNamespace(name="fake")
    _, info = case_mod.time_prepared(spec, backend, None, prepared, ctx, clocks=monitor)
    window = info["gpu_state"]["window"]
    assert sampler.started and window["samples"] == 2 and window["over"] == "timed calls"
    assert window["sm_clock_mhz"]["min"] == 1650.0 and window["power_w"]["max"] == 700.0
    assert info["clock_dropped"]  # 1980 -> 1650 inside the window, though the end read 1900
    assert info["launch"] == timed["launch"] and "timed_s" not in info


def test_launch_overhead_says_when_the_host_is_slower_than_the_device():
    host = [5.0, 0.06, 0.05, 0.05, 0.04]  # the first call compiles: only the later half counts
    assert launch_info(host, [0.02, 0.03, 0.02]) == {"host_ms": 0.05, "host_bound": True}
    assert launch_info(host, [1.5, 1.4]) == {"host_ms": 0.05, "host_bound": False}

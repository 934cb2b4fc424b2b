"""Environment capture and GPU clock readings work (and degrade to nothing) without a GPU."""

import sys
import types

import torch

from attnbench.results import env as envmod
from attnbench.timing import clocks


def test_collect_without_gpu():
    env = envmod.collect("cpu")
    assert env["device"] == "cpu" and env["device_name"] == envmod.device_name("cpu")
    assert env["torch"] == torch.__version__ and "gpu" not in env
    assert len(envmod.env_id(env)) == 12 and envmod.env_id(env) == envmod.env_id(dict(env, collected_at=0))


def test_clock_monitor_and_static_info_are_empty_on_cpu():
    monitor = clocks.ClockMonitor("cpu")
    assert monitor.sample() == {} and not monitor.enabled
    assert clocks.static_info("cpu") == {}


def test_parse_nvidia_smi_line():
    got = clocks.parse_smi("1980, 41, 312.55, 700.00, 1980, 570.86.15, NVIDIA H100 80GB HBM3")
    assert got["sm_clock_mhz"] == 1980 and got["temperature_c"] == 41 and got["power_limit_w"] == 700.0
    assert got["driver"] == "570.86.15" and got["name"] == "NVIDIA H100 80GB HBM3"
    assert clocks.parse_smi("1755, 60, [N/A], [N/A], 1980, 550.1, GPU")["power_w"] is None


def test_nvml_reads_through_pynvml(monkeypatch):
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetHandleByUUID=lambda uuid: ("h", uuid), nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetClockInfo=lambda h, kind: 1755, nvmlDeviceGetTemperature=lambda h, kind: 63,
        nvmlDeviceGetPowerUsage=lambda h: 650_000, nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980, nvmlSystemGetDriverVersion=lambda: b"570.86.15")
    assert clocks._nvml_read(fake, "GPU-abc", 0, static=False) == {"sm_clock_mhz": 1755, "temperature_c": 63,
                                                                  "power_w": 650.0}
    static = clocks._nvml_read(fake, None, 0, static=True)
    assert static == {"power_limit_w": 700.0, "max_sm_clock_mhz": 1980, "driver": "570.86.15", "source": "nvml"}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: no NVML, no exception
    clocks._pynvml.cache_clear()
    assert clocks._pynvml() is None
    clocks._pynvml.cache_clear()


def test_clock_drop_flag():
    assert clocks.clock_dropped({"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1500})
    assert not clocks.clock_dropped({"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1900})
    assert not clocks.clock_dropped({"sm_clock_mhz": 345}, {"sm_clock_mhz": 1980})  # rising is fine
    assert not clocks.clock_dropped({}, {})

"""GPU clocks, temperature and power: read at the start and end of each case to catch throttling, and
sampled across its timed calls (``WindowSampler``) to show what the GPU did while they ran.

Uses NVML through nvidia-ml-py (``import pynvml``) when it is installed (microseconds per read),
else ``nvidia-smi --query-gpu`` (tens of ms per read, so its answers are reused for up to a
second). On CPU, ROCm, or without either tool every read returns ``{}``; nothing here raises.
Sampling across the calls needs a read that costs microseconds: NVML, else torch's wrappers
(``torch.cuda.clock_rate``, ``power_draw``, ``temperature``: NVML again, or amdsmi on ROCm); never
nvidia-smi, whose process per read would compete with the timed calls for the host.
"""

from __future__ import annotations

import functools
import logging
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

CLOCK_DROP = 0.10
"""A case is flagged when its SM clock fell by more than this fraction between start and end."""
SMI_FIELDS = ("clocks.sm", "temperature.gpu", "power.draw", "power.limit", "clocks.max.sm", "driver_version", "name")
SMI_CACHE_S = 1.0
SAMPLE_INTERVAL_MS = 20.0
"""Time between two reads of the sampler. About 5 reads in a 100 ms case; each read is three NVML calls of a few
microseconds, which release the GIL, so the timed calls' host thread loses well under 1% of its time to them.
NVML's SM clock is the current one; its power is the driver's average over its own period (up to a second, per
nvidia-smi's documentation), so within one case the power readings trail the calls."""
WINDOW_QUANTITIES = ("sm_clock_mhz", "power_w", "temperature_c")


@functools.cache
def _pynvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, or no NVIDIA driver
        return None


def device_uuid(device: torch.device) -> str | None:
    """``GPU-<uuid>`` of a CUDA device as NVML and nvidia-smi name it, if torch reports it."""
    import torch

    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:
        return None
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _nvml_read(nvml, uuid: str | None, index: int, static: bool) -> dict:
    handle = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
    if static:
        driver = nvml.nvmlSystemGetDriverVersion()
        return {"power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
                "driver": driver.decode() if isinstance(driver, bytes) else driver, "source": "nvml"}
    return {"sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}


def parse_smi(line: str) -> dict:
    """One ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` line -> dict."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < len(SMI_FIELDS):
        raise ValueError(f"unexpected nvidia-smi output: {line!r}")
    raw = dict(zip(SMI_FIELDS, parts, strict=False))

    def num(key):
        try:
            return float(raw[key])
        except ValueError:  # "[N/A]", "[Not Supported]"
            return None
    return {"sm_clock_mhz": num("clocks.sm"), "temperature_c": num("temperature.gpu"), "power_w": num("power.draw"),
            "power_limit_w": num("power.limit"), "max_sm_clock_mhz": num("clocks.max.sm"),
            "driver": raw["driver_version"], "name": raw["name"]}


def _smi_read(target: str) -> dict:
    if shutil.which("nvidia-smi") is None:
        return {}
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits",
                          "-i", target], capture_output=True, text=True, timeout=10)
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    return parse_smi(out.stdout.strip().splitlines()[0])


def _usable(device: torch.device) -> bool:
    import torch

    return device.type == "cuda" and torch.cuda.is_available() and torch.version.hip is None


def static_info(device: str | torch.device) -> dict:
    """Power limit, max SM clock and driver of ``device``; {} when not an NVIDIA GPU or not readable."""
    import torch

    device = torch.device(device)
    if not _usable(device):
        return {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        nvml = _pynvml()
        if nvml is not None:
            return _nvml_read(nvml, device_uuid(device), index, static=True)
        smi = _smi_read(device_uuid(device) or str(index))
        return {k: smi[k] for k in ("power_limit_w", "max_sm_clock_mhz", "driver") if k in smi} | (
            {"source": "nvidia-smi"} if smi else {})
    except Exception as exc:  # never fail a run over a sensor
        log.debug("reading GPU static info failed: %s", exc)
        return {}


class ClockMonitor:
    """Reads SM clock, temperature and power of one device (``sample``); all {} where unsupported."""

    def __init__(self, device: str | torch.device):
        import torch

        self.device = torch.device(device)
        self.enabled = _usable(self.device)
        self._cached: tuple[float, dict] | None = None

    def sample(self) -> dict:
        import torch

        if not self.enabled:
            return {}
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            nvml = _pynvml()
            if nvml is not None:
                return _nvml_read(nvml, device_uuid(self.device), index, static=False)
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > SMI_CACHE_S:
                smi = _smi_read(device_uuid(self.device) or str(index))
                self._cached = (now, {k: smi.get(k) for k in ("sm_clock_mhz", "temperature_c", "power_w")} if smi else {})
            return dict(self._cached[1])
        except Exception as exc:
            log.debug("reading GPU clocks failed: %s", exc)
            self.enabled = False
            return {}

    def reader(self) -> tuple[Callable[[], dict], str] | None:
        """(a read of SM clock, power and temperature costing microseconds, its source name) for ``WindowSampler``:
        NVML, else torch's wrappers where a first read through them works; None on CPU or without either."""
        import torch

        if self.device.type != "cuda" or not torch.cuda.is_available():
            return None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        nvml = _pynvml() if self.enabled else None
        if nvml is not None:
            uuid = device_uuid(self.device)
            return (lambda: _nvml_read(nvml, uuid, index, static=False)), "nvml"
        try:
            _torch_read(index)
        except Exception as exc:  # no pynvml (NVIDIA) or amdsmi (ROCm) behind torch's wrappers
            log.debug("no GPU sensor reads through torch: %s", exc)
            return None
        return (lambda: _torch_read(index)), "torch"


def _torch_read(index: int) -> dict:
    """SM clock, temperature and power through torch's wrappers (power: mW through NVML, W through amdsmi)."""
    import torch

    power = torch.cuda.power_draw(index)
    watts = (power if torch.version.hip else power / 1000.0) if power else None
    return {"sm_clock_mhz": torch.cuda.clock_rate(index) or None, "temperature_c": torch.cuda.temperature(index),
            "power_w": watts}


class WindowSampler:
    """Reads the GPU state with ``read`` every ``interval_ms`` in a background thread, from ``start`` to ``stop``.

    ``readings``: (``clock()`` seconds when the read returned, what it returned). A read that raises ends the
    sampling quietly (a sensor must never fail a run); the readings taken so far are kept."""

    def __init__(self, read: Callable[[], dict], *, interval_ms: float = SAMPLE_INTERVAL_MS, source: str = "",
                 clock: Callable[[], float] = time.perf_counter):
        if not interval_ms > 0:
            raise ValueError(f"interval_ms must be > 0, got {interval_ms!r}")
        self.read, self.interval_ms, self.source, self.clock = read, interval_ms, source, clock
        self.readings: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> WindowSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpu-window-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, dict]]:
        """Stop the thread (it finishes a read in flight) and return the readings."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.readings

    def _loop(self) -> None:
        while True:
            try:
                reading = self.read()
                self.readings.append((self.clock(), reading))
            except Exception as exc:
                log.debug("sampling GPU sensors stopped: %s", exc)
                return
            if self._stop.wait(self.interval_ms / 1000.0):
                return


def window_summary(readings: list[tuple[float, dict]], window: tuple[float, float] | None = None, *,
                   source: str = "", interval_ms: float = SAMPLE_INTERVAL_MS) -> dict:
    """What the readings say of the GPU while the calls ran: per quantity (``WINDOW_QUANTITIES``) its min, median
    and max over the readings, and how many there were. ``window`` (start, end in the readings' clock, the
    timed calls'): only the readings taken in it, or, where none was (a window shorter than the interval),
    all of them, said by ``over``. {} when there is no reading."""
    inside = [r for t, r in readings if window is not None and window[0] <= t <= window[1]]
    over = "timed calls" if inside else "case"
    chosen = inside or [r for _, r in readings]
    out: dict = {}
    for key in WINDOW_QUANTITIES:
        values = [float(r[key]) for r in chosen if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    if not out:
        return {}
    return out | {"samples": len(chosen), "over": over, "interval_ms": interval_ms} | (
        {"source": source} if source else {})


def clock_dropped(start: dict, end: dict, threshold: float = CLOCK_DROP) -> bool:
    """True when the SM clock at ``end`` is more than ``threshold`` below the one at ``start``."""
    a, b = start.get("sm_clock_mhz"), end.get("sm_clock_mhz")
    return bool(a and b is not None and b < (1 - threshold) * a)

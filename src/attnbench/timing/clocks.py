"""GPU clocks, temperature and power: read at the start and end of each case to catch throttling.

Uses NVML through nvidia-ml-py (``import pynvml``) when it is installed (microseconds per read),
else ``nvidia-smi --query-gpu`` (tens of ms per read, so its answers are reused for up to a
second). On CPU, ROCm, or without either tool every read returns ``{}``; nothing here raises.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

CLOCK_DROP = 0.10
"""A case is flagged when its SM clock fell by more than this fraction between start and end."""
SMI_FIELDS = ("clocks.sm", "temperature.gpu", "power.draw", "power.limit", "clocks.max.sm", "driver_version", "name")
SMI_CACHE_S = 1.0


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


def clock_dropped(start: dict, end: dict, threshold: float = CLOCK_DROP) -> bool:
    """True when the SM clock at ``end`` is more than ``threshold`` below the one at ``start``."""
    a, b = start.get("sm_clock_mhz"), end.get("sm_clock_mhz")
    return bool(a and b is not None and b < (1 - threshold) * a)

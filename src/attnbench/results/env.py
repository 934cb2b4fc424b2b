"""Environment fingerprint: what hardware and software produced a result.

Collected once per run; its id is a hash of the stable fields, so runs on the same machine and
software share an id. Never initialises CUDA on import; only when ``collect`` is called.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from attnbench.timing import clocks
from attnbench.version import __version__

# Packages whose versions matter to attention results (absent ones are simply not listed).
PACKAGES = ("torch", "triton", "numpy", "flash-attn", "flash-attn-3", "flash-attn-4", "xformers",
            "sageattention", "spas-sage-attn", "flashinfer-python", "diffusers", "transformers",
            "ring-flash-attn", "yunchang", "nvidia-ml-py")
VOLATILE = ("collected_at",)


def _versions() -> dict[str, str]:
    out = {}
    for dist in PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def git_sha() -> str | None:
    """Commit of the attnbench source tree, when it is a git checkout."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str | torch.device = "cpu") -> str:
    """Name of the device as recorded in fingerprints and peaks (GPU product name, or the CPU model)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).name
    return _cpu_name()


def collect(device: str | torch.device = "cpu") -> dict:
    """Fingerprint of this machine and software for ``device``."""
    import time

    import torch
    device = torch.device(device)
    env = {
        "attnbench": __version__, "git_sha": git_sha(), "python": platform.python_version(),
        "os": platform.platform(), "hostname": platform.node(), "cpu": _cpu_name(), "cpu_threads": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "platform": platform_name(), "torch_build": torch_build(),
        "packages": _versions(), "device": str(device), "collected_at": time.time(),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_name=props.name, device_count=torch.cuda.device_count(),
            compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
            device_memory_bytes=props.total_memory, l2_cache_bytes=getattr(props, "L2_cache_size", None),
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        )
        gpu = clocks.static_info(device)  # power limit, max SM clock, driver (NVML or nvidia-smi)
        env.update(driver=gpu.get("driver") or _nvidia_driver(), gpu=gpu)
    else:
        env.update(device_name=_cpu_name())
    return env


def torch_build() -> str:
    """What torch was built for: ``CUDA 13.0``, ``ROCm 6.4`` or ``CPU only``."""
    import torch

    hip = getattr(torch.version, "hip", None)
    return f"ROCm {hip}" if hip else f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"


def platform_name() -> str:
    """What the kernels run on here: ``cuda`` or ``rocm`` when torch sees a GPU, else ``cpu`` (a CUDA build of
    torch on a machine without a GPU is a CPU platform)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def describe_platform(env: dict) -> str:
    """The platform as ``env`` prints it: ``cpu (torch built for CUDA 13.0, no GPU)`` where the two differ."""
    platform, build = env.get("platform") or "?", env.get("torch_build")
    if platform == "cpu" and build and build != "CPU only":
        return f"cpu (torch built for {build}, no GPU)"
    return platform


def env_id(env: dict) -> str:
    """Stable hash of the fingerprint (volatile fields excluded)."""
    stable = {k: v for k, v in env.items() if k not in VOLATILE}
    return hashlib.sha1(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:12]

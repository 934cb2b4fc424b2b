"""Shared test set-up: GPU tests skip cleanly without a device; under pytest-xdist, a GPU test that
compares times (marked ``gpu_exclusive``) has the GPU to itself.

Every GPU test holds a shared lock on a file named after the visible devices while it runs, and a
``gpu_exclusive`` test holds it exclusively, so no other test's kernels run beside a timing comparison
(seen under ``-n 8`` without it: a matmul timed by events at twice the wall-clock reference taken a
moment later, a CUDA graph slower than eager calls). Two pytest runs on one machine share the lock too:
they share the GPU.
"""

from __future__ import annotations

import fcntl
import inspect
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

SUBPROCESS = re.compile(r"\b(subprocess\.|attnbench\(|attnbench_bounded\(|torchrun)")
"""What a test calls to start attnbench (or any program) in a process of its own: each start imports torch again
(2-4 s on a 2-core machine), so such a test is ``slow`` and ``pytest -m "not slow"`` leaves it out."""


def _starts_a_process(item) -> bool:
    try:
        return bool(SUBPROCESS.search(inspect.getsource(item.function)))
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slow" not in item.keywords and _starts_a_process(item):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _gpu_lock_path() -> Path:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "none"
    return Path(tempfile.gettempdir()) / f"attnbench-tests-gpu-{os.getuid()}-{devices}.lock"


@pytest.fixture(autouse=True)
def _gpu_share(request):
    """The GPU lock: shared for GPU tests, exclusive for ``gpu_exclusive`` ones; none on the CPU."""
    if "gpu" not in request.keywords or not torch.cuda.is_available():
        yield
        return
    with open(_gpu_lock_path(), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if "gpu_exclusive" in request.keywords else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _output_width(monkeypatch):
    """Output to a pipe is laid out for $COLUMNS, 100 when unset; pytest-xdist sets it to 80 in its workers,
    which cut the lines some tests read. Every test sees the width a user piping the output sees."""
    monkeypatch.setenv("COLUMNS", "100")


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "results.db"

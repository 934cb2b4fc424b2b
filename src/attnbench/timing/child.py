"""Run cases' closures under an external profiler: ``python -m attnbench.timing.child JOB.json``.

The parent (``external.py``) writes a job file: device, seed, warm-up, whether to flush the L2, the events
timer's time cap, and a list of cases (spec, backend name, calls). For each case the child prepares the backend
and warms up outside any range, then launches the marked sequence (``marked.py``) inside the NVTX/roctx range
``attnbench_timed`` and synchronises before closing it, so profilers can filter on the range (autograd's backward
runs on the same thread, so a backward pass's kernels are inside it too). A case makes the calls asked, or fewer
where they would add up to more than the cap (as the events timer samples), and reports how many it made, with
what its backend reported (``Prepared.info``) or why it failed, in the job's result file.
Nothing is printed on stdout: the profiler's report goes there.

A case that fails before its timed range (preparing, warming up: out of memory, a shape the kernel refuses) is
reported as failed and the next case runs; its range never opens, so the trace has no block for it. A failure
inside the range, or one that leaves the CUDA context unusable, ends the job: the cases after it are not
reported, and the parent profiles them again on their own.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

from attnbench.backends.base import sync
from attnbench.timing.config import TimingConfig


def run_job(job: dict) -> list[dict]:
    from attnbench import operators
    from attnbench.backends import registry
    from attnbench.inputs import InputDist
    from attnbench.timing.events import L2Flusher
    from attnbench.timing.marked import TIMED_RANGE, Marker, launch_marked
    from attnbench.timing.nvtx import nvtx_range

    device = torch.device(job["device"])
    cap = job.get("max_time_ms")  # the events timer's time cap (None: none, fixed configs)
    config = TimingConfig(warmup=job.get("warmup", 1), max_time_ms=math.inf if cap is None else cap)
    flush = L2Flusher(device) if job.get("cold_l2") else None
    marker = Marker(device)
    results = []
    for case in job["cases"]:
        spec = operators.spec_from_dict(case["spec"])
        backend = registry.get(case["backend"], job.get("backend_options", {}).get(case["backend"]))
        try:
            inputs = operators.of(spec).make_inputs(spec, device, job.get("seed", 0),
                                                    InputDist(**(job.get("inputs") or {})))
            prepared = backend.prepare_case(spec, inputs)
            per_call_ms = _warm_up(prepared.fn, config, device)
        except Exception as exc:  # noqa: BLE001 - the case failed; its range never opened
            inputs = prepared = None
            results.append({"backend": backend.name, "error": f"{type(exc).__name__}: {_first_line(exc)}"})
            if not _usable(device):
                break
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        iterations = config.calls_within_cap(case["iterations"], per_call_ms, device.type)
        # autograd runs a CUDA backward on a thread of its own, and NVTX push/pop ranges belong to the thread that
        # opened them: without this, ncu's range filter kept only the forward kernels of a backward pass
        with torch.autograd.set_multithreading_enabled(False), nvtx_range(TIMED_RANGE, device):
            launch_marked(prepared.fn, iterations, marker, flush)
            sync(device)
        results.append({"backend": backend.name, "info": prepared.info, "iterations": iterations})
        del prepared, inputs
    return results


def _warm_up(fn, config: TimingConfig, device: torch.device) -> float:
    """Warm-up calls as the events timer makes them (``TimingConfig.warmup_calls``: at most a quarter of the
    time cap after the first call); the wall ms of the last one, synchronized: what a call costs."""
    def call() -> float:
        started = time.perf_counter()
        fn()
        sync(device)
        return (time.perf_counter() - started) * 1e3
    last = call()
    for _ in range(config.warmup_calls(last, device.type)):
        last = call()
    return last


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def _usable(device: torch.device) -> bool:
    """Whether the CUDA context survived a failed case (an illegal memory access poisons it for good)."""
    try:
        sync(device)
        torch.zeros(1, device=device).add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m attnbench.timing.child JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    results = run_job(job)
    Path(job["result"]).write_text(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile ahead: the cases of a sweep that compile code per shape (``Backend.compiles_ahead``: flex's
torch.compile, SpargeAttn's Triton kernels) are compiled in worker processes while the main process
times the other cases.

A compile (dynamo, AOTAutograd, inductor, Triton) is seconds of serial host work per shape and pass,
and a sweep has dozens. The workers run the backend's own ``prepare`` on the case's seeded inputs,
which fills the on-disk caches (inductor's FX graph and AOTAutograd caches, Triton's kernel cache);
when the main process reaches the case, its ``prepare`` finds the compiled code there (flex then only
traces: about 0.4 s instead of 2-5 s on an H200 host). Nothing a worker measures is used. A case whose
compile has not started in a worker when the main process reaches it is compiled there instead.

The workers share the GPU: each compile ends with one call of the compiled kernel (forward, or forward
and backward). Those calls can overlap samples the main process is taking; for a short case such a
sample is slow, an outlier that the median does not follow. A long case takes few samples and the calls
can move its median (STA cases on an H100 came out up to 2x slow with a tight spread), so the runner
times a case whose call needs ``runner.long_case_ms`` or more at the device's peak rate (15 ms on a GPU
by default: such cases get the fewest samples), or that is bound by memory and streams it for
``runner.MEMORY_BOUND_MS`` or more (a worker making its inputs shares the bandwidth), only when no worker is running: other cases go first, and when only long ones are left it waits for the workers (``drain``).
A case timed while workers were busy says so in its record (``info["compile_workers_busy"]``).

The workers and the main process must look for Triton kernels in one directory: see ``share_triton_cache``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor

from attnbench.backends.base import Backend
from attnbench.spec import AttnSpec

log = logging.getLogger(__name__)

MAX_WORKERS = 6


def worker_count(jobs: int, cpus: int | None = None) -> int:
    """Workers for ``jobs`` compiles: one per two host cores left after the main process, at most 6."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(0, min(jobs, MAX_WORKERS, (cpus - 2) // 2))


def share_triton_cache(device: str) -> str | None:
    """Point ``TRITON_CACHE_DIR`` at the directory inductor would pick, unless the user has set it; the
    directory the run's processes share (None where torch does not say which it is).

    Triton looks in ``~/.triton/cache`` until a process builds its first inductor kernel (a flex graph);
    inductor then points ``TRITON_CACHE_DIR`` at its own directory, for the rest of that process. A worker
    that had compiled a flex case put SpargeAttn's kernels in one directory, a main process that had not
    yet run flex looked in the other, or the other way round: on an H100 default sweep the main process
    compiled SpargeAttn's kernels again, 2 s a case, 24 s a run. Set before the workers start, it is one
    directory for every process (spawned workers inherit the environment).
    """
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    except ImportError:  # torch < 2.5: the directory is left to each process, as before
        return None
    index = int(device.partition(":")[2] or 0)
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir(index)
    return os.environ["TRITON_CACHE_DIR"]


def _init_worker() -> None:
    # Triton's parallel compile pool in every worker would oversubscribe the host; one graph is one kernel.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch._inductor.config
    torch._inductor.config.compile_threads = int(os.environ["TORCHINDUCTOR_COMPILE_THREADS"])


def _compile_case(spec: AttnSpec, backend: Backend, device: str, seed: int, inputs_dist) -> float:
    """Prepare the case once in this (worker) process; the wall seconds it took."""
    import torch

    from attnbench.inputs import make_inputs
    start = time.perf_counter()
    dev = torch.device(device)
    inputs = make_inputs(spec, dev, seed, inputs_dist)
    backend.prepare_case(spec, inputs)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - start
    del inputs
    if dev.type == "cuda":  # the worker lives on: give the case's memory back to the device, not to its cache
        torch.cuda.empty_cache()
    return seconds


class Precompiler:
    """Compiles ``cases`` ((spec, backend) pairs) in worker processes, in the order given. The backend
    objects themselves go to the workers, configured as they are here (``--backend-opt``)."""

    def __init__(self, cases: list[tuple[AttnSpec, Backend]], *, device: str, seed: int, inputs_dist,
                 workers: int | None = None):
        workers = worker_count(len(cases)) if workers is None else workers
        self.futures: dict[tuple[AttnSpec, str], Future] = {}
        self.seconds: dict[str, list[float]] = {}
        """Per backend, the wall seconds of each case a worker compiled and the main process then took
        (inputs and ``prepare``: a JIT build shows here)."""
        self.workers = 0
        self.pool = None
        if workers < 1 or not cases:
            return
        self.workers = workers
        share_triton_cache(device)
        # spawn: a forked child would inherit this process's CUDA context, which CUDA does not allow.
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker)
        for spec, backend in cases:
            self.futures[(spec, backend.name)] = self.pool.submit(_compile_case, spec, backend, device, seed,
                                                                  inputs_dist)
        log.info("compiling %d cases ahead in %d worker processes", len(cases), workers)

    def wait(self, spec: AttnSpec, backend_name: str) -> None:
        """Block until the worker compiling this case is done (no-op for a case not compiled ahead).
        A worker's failure is only logged: the main process then compiles the case itself and records
        what happens there."""
        future = self.futures.pop((spec, backend_name), None)
        if future is None or future.cancel():
            return
        try:
            self.seconds.setdefault(backend_name, []).append(future.result())
        except Exception as exc:  # a broken worker pool included
            log.info("compiling %s %s ahead failed (%s); compiling it here", backend_name, spec.label(), exc)
        if self.pool is not None and all(f.done() for f in self.futures.values()):
            # Nothing left to compile: the workers exit now, while the run goes on. Left to the end, the
            # process waited ~3 s for them at exit (each tears down torch and a CUDA context).
            self.pool.shutdown(wait=False)
            self.pool = None

    def pending(self, spec: AttnSpec, backend_name: str) -> bool:
        """Whether a worker is still compiling (or yet to compile) this case."""
        future = self.futures.get((spec, backend_name))
        return future is not None and not future.done()

    def summary(self) -> str | None:
        """One line on what the workers compiled, e.g. 'compiled ahead in 6 workers: flashinfer 16 cases
        (longest 98 s), flex 24 cases (longest 5 s)'; None when nothing was. The longest case, not a sum:
        workers build in parallel, and cases that share a JIT module wait for one build."""
        if not self.seconds:
            return None
        parts = [f"{name} {len(s)} case{'s' * (len(s) != 1)} (longest {max(s):.0f} s)"
                 for name, s in self.seconds.items() if s]  # a backend whose cases all failed to build has none
        if not parts:
            return None
        return f"compiled ahead in {self.workers} worker{'s' * (self.workers != 1)}: " + ", ".join(parts)

    def drain(self) -> None:
        """Block until every compile given to the workers has finished (results stay for ``wait``)."""
        for future in list(self.futures.values()):
            try:
                future.exception()
            except Exception:  # cancelled: nothing to wait for
                pass

    @property
    def busy(self) -> bool:
        """Whether any worker is still compiling."""
        return any(f.running() for f in self.futures.values())

    def close(self) -> None:
        """Stop: pending compiles are dropped; running ones finish in the background and their workers exit."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        self.futures.clear()

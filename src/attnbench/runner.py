"""The one measuring pipeline: spec -> backend.supports -> prepare -> measure -> Record -> store.

Every case becomes a Record written to the store before the next case starts. Failures become
statuses (unsupported, oom, error, nan), never exceptions that end the sweep. A kernel that leaves the
CUDA context unusable (an illegal memory access) costs only its own case: it is recorded as an error
and the rest of the sweep runs case by case in worker processes (``attnbench.isolate``).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import pickle
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from attnbench import operators, plausibility
from attnbench.backends import registry
from attnbench.backends.base import Backend, BackendUnavailable, Outputs
from attnbench.inputs import AttnInputs, InputDist
from attnbench.isolate import STARTUP_TIMEOUT_S, Worker, WorkerDied, WorkerTimeout
from attnbench.metrics import gb_per_s, tflops_per_s
from attnbench.plausibility import Ceilings
from attnbench.precompile import Precompiler
from attnbench.results.record import Record, case_id
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig, summarize
from attnbench.timing.case import CaseContext, profile_sessions, time_prepared
from attnbench.timing.clocks import ClockMonitor
from attnbench.timing.config import MIN_SAMPLES
from attnbench.timing.cpu_load import CpuPlan
from attnbench.timing.fresh import FreshInputs
from attnbench.timing.nvtx import nvtx_range

log = logging.getLogger(__name__)

# (spec, inputs, outputs, backend) -> accuracy dict with a "verdict" key, or None to skip.
Checker = Callable[[AttnSpec, AttnInputs, Outputs, Backend], "dict | None"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything about how cases are run, apart from the cases themselves."""

    device: str
    """cpu, cuda or cuda:N."""
    backends: tuple[str, ...]
    """Backend names, in the order they run for each case."""
    timing: TimingConfig = field(default_factory=TimingConfig)
    """Warm-up, repeat and timing method."""
    flops_convention: str = "exact"
    """exact (attended pairs) or dense (every pair)."""
    seed: int = 0
    """Seed of the inputs."""
    trace_dir: str | None = None
    """Write a Chrome/Perfetto trace (torch.profiler) of every case into this directory."""
    cooldown_s: float = 0.0
    """Seconds to sleep before each case after the first (lets clocks and temperature settle)."""
    inputs: InputDist = field(default_factory=InputDist)
    """How q, k, v are drawn (N(0, 1) by default; larger magnitudes or outliers on request)."""
    ceilings: Ceilings | None = None
    """What the device can do at most (plausibility.ceilings); None: from its datasheet alone."""
    compile_workers: int | None = None
    """Worker processes that torch.compile cases ahead on a GPU (``attnbench.precompile``); None = one per
    two host cores (at most 6), 0 = compile each case in this process when it comes."""
    cpu: CpuPlan | None = None
    """CPU runs: the torch threads to time with and why (``cpu_load.plan``); None = torch's own setting."""
    batch_names: dict | None = None
    """Serving batches read from a trace: (seqlens_q, seqlens_k) -> the step's name, kept in each record's
    ``info["batch_name"]``."""
    backend_options: dict = field(default_factory=dict)
    """Backend name -> the constructor options it runs with (``--backend-opt``, checked by
    ``backends.options.resolve``); the registry itself is never changed."""


def long_case_ms(timing: TimingConfig, device_type: str) -> float:
    """Calls at least this long get the fewest samples (``MIN_SAMPLES`` fill the sampling time cap: 15 ms on a
    GPU by default), so a few slow ones move the median: such cases wait for the compile workers
    (``Runner._long_while_compiling``)."""
    return timing.max_time_for(device_type) / MIN_SAMPLES


MEMORY_BOUND_MS = 0.25
"""A memory-bound case that needs this long at the device's bandwidth waits for the compile workers (they share it)."""


@dataclass
class PhaseClock:
    """Wall seconds spent per phase of a run (inputs, prepare, check, timing, ...)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @contextmanager
    def phase(self, name: str, case: dict | None = None):
        """Time the block into ``name`` (and into the case's own dict, when given)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.seconds[name] += dt
            if case is not None:
                case[name] = case.get(name, 0.0) + dt


class Runner:
    """Runs cases and writes each Record through ``sink`` (e.g. ``ResultStore.write``) at once."""

    def __init__(self, options: RunOptions, *, run_id: str, env_id: str | None,
                 sink: Callable[[Record], None], checker: Checker | None = None,
                 skip: set[str] | None = None, on_case: Callable[[AttnSpec, str], None] | None = None):
        self.options = options
        self.device = torch.device(options.device)
        self.run_id, self.env_id = run_id, env_id
        self.sink, self.checker, self.on_case = sink, checker, on_case
        self.skip = skip or set()
        self.clock = PhaseClock()
        self.stop_requested = False
        """Set (e.g. by a SIGINT handler) to stop after the case in flight."""
        self.backends = [registry.get(name, options.backend_options.get(name)) for name in options.backends]
        self.clocks = ClockMonitor(self.device)
        self.ceilings = options.ceilings or plausibility.ceilings(self.device)
        self.precompiler = Precompiler([], device=options.device, seed=options.seed, inputs_dist=options.inputs)
        """Compiles cases ahead in worker processes during ``run``."""
        self.device_lost = False
        """Set when a case left this process's CUDA context unusable; no more work runs in it."""
        self._ideal_ms: dict[AttnSpec, tuple[float, float]] = {}
        self.sessions = None
        """External profilers in a sweep (``timing.external.ProfileSessions``): one process per backend."""
        if self.device.type == "cpu" and options.cpu is not None:  # the run's own setting, as timeit's number
            torch.set_num_threads(options.cpu.threads)

    def cases(self, specs: Iterable[AttnSpec]) -> list[tuple[AttnSpec, Backend]]:
        """The (spec, backend) pairs still to run, shape-major; within a shape, backends whose cases are
        compiled ahead come last, so the workers compiling them get a head start."""
        mode = self.timing_mode
        order = sorted(self.backends, key=lambda b: b.compiles_ahead)  # stable: the given order otherwise
        return [(s, b) for s in specs for b in order if case_id(s, b.name, mode) not in self.skip]

    @property
    def timing_mode(self) -> str:
        return "cpu" if self.device.type == "cpu" else self.options.timing.mode

    def run(self, specs: Iterable[AttnSpec]) -> list[Record]:
        cases = self.cases(specs)
        self.precompiler = self._start_precompiler(cases)
        if self.options.timing.external:
            self.sessions = profile_sessions(self._timing_context(), [
                (s, b.name) for s, b in cases if b.supports(s, self.device) is None], lambda: self.stop_requested)
        # What exists now (torch, the kernel packages, their registries: ~1M objects once everything is
        # installed) lives as long as the run. Out of the garbage collector's sight, a full collection
        # costs milliseconds instead of 0.3-0.4 s: on an H100 default sweep with every kernel installed,
        # 21 full collections (most asked for by _free, after each shape and each failed case) took 8 s.
        # Cycles made during the run (a failed case's traceback holding its tensors) are still collected.
        gc.freeze()
        try:
            return self._run(cases)
        finally:
            gc.unfreeze()
            self.precompiler.close()

    def _start_precompiler(self, cases: list[tuple[AttnSpec, Backend]]) -> Precompiler:
        ahead = [(s, b) for s, b in cases if self.device.type == "cuda" and b.compiles_ahead
                 and b.supports(s, self.device) is None]
        workers = self.options.compile_workers
        if len(ahead) < 2:  # one compile gains nothing from a worker that must start torch first
            workers = 0
        return Precompiler(ahead, device=str(self.device), seed=self.options.seed, inputs_dist=self.options.inputs,
                           workers=workers)

    def _run(self, cases: list[tuple[AttnSpec, Backend]]) -> list[Record]:
        records: list[Record] = []
        inputs, inputs_key = None, None
        queue = deque(cases)
        while queue:
            spec, backend = queue.popleft()
            if self.stop_requested:
                break
            busy = self.precompiler.busy
            if not self._ready(spec, backend, busy) and any(self._ready(s, b, busy) for s, b in queue):
                # its worker is still compiling (a JIT build can take minutes), or it is a long case that
                # the workers' kernel calls would slow: time other cases meanwhile
                queue.append((spec, backend))
                continue
            if self._long_while_compiling(spec, busy):
                with self.clock.phase("compile"):  # only long cases are left: let the workers finish first
                    self.precompiler.drain()
            new_shape = spec.shape_key() != inputs_key
            released = True
            if new_shape:
                inputs, inputs_key = None, spec.shape_key()
                with self.clock.phase("inputs"):
                    released = self._release_inputs()
            if self.device_lost or not released:
                records += self._run_isolated([(spec, backend), *queue])
                break
            if self.on_case:
                self.on_case(spec, backend.name)
            if records and self.options.cooldown_s > 0:
                with self.clock.phase("cooldown"):
                    time.sleep(self.options.cooldown_s)
            unsupported = backend.supports(spec, self.device)
            if inputs is None and not unsupported:  # made for the shape's first case a backend takes, so a
                with self.clock.phase("inputs"):  # shape no backend takes costs nothing (a paged batch on a CPU)
                    inputs = self.make_inputs_guarded(spec)
            if unsupported:
                record = self._record(spec, backend, status="unsupported", reason=unsupported,
                                      info=backend.base_info())
            elif not isinstance(inputs, tuple):
                with self.clock.phase("compile"):
                    self.precompiler.wait(spec, backend.name)
                with nvtx_range(f"{backend.name} {spec.label()} {spec.pass_}", self.device):
                    record = self.run_case(spec, backend, inputs, check=self.checker is not None)
            else:  # the shape's inputs could not be made: every backend that takes it gets that status
                status, reason = inputs
                record = self._record(spec, backend, status=status, reason=reason, info=backend.base_info())
            with self.clock.phase("store"):
                self.sink(record)
            records.append(record)
        return records

    def make_inputs_guarded(self, spec: AttnSpec) -> AttnInputs | tuple[str, str]:
        """The case's inputs, or (status, reason) when they cannot be made (too large for the device: the
        operator's memory guard is asked first, so nothing is allocated for a case that cannot fit)."""
        op = operators.of(spec)
        reason = op.memory_guard(spec, None, self.device, inputs_allocated=False)
        if reason:
            return "oom", "inputs: " + reason
        try:
            return op.make_inputs(spec, self.device, self.options.seed, self.options.inputs)
        except torch.OutOfMemoryError as exc:
            _free(self.device)
            return "oom", f"inputs: {_first_line(exc)}"
        except (RuntimeError, ValueError) as exc:  # e.g. a shape too large to index
            return "error", f"inputs: {type(exc).__name__}: {_first_line(exc)}"

    def record_of(self, spec: AttnSpec, backend: Backend, *, status: str, reason: str, info: dict) -> Record:
        """The record of a case that did not run (``status``, ``reason``), as this runner writes records."""
        return self._record(spec, backend, status=status, reason=reason, info=info)

    def _record(self, spec: AttnSpec, backend: Backend, **fields) -> Record:
        if not self.options.inputs.is_default:
            fields["info"] = dict(fields.get("info") or {}, inputs=self.options.inputs.describe())
        name = None
        if self.options.batch_names:
            name = self.options.batch_names.get((spec.seqlens_q, spec.seqlens_k))
        if name is not None:
            fields["info"] = dict(fields.get("info") or {}, batch_name=name)
        if getattr(spec, "sta", None) is not None:  # what share of the (query, key) pairs the FLOP count covers
            fields["info"] = dict(fields.get("info") or {}, kept_fraction=round(spec.sta.kept_fraction(spec.heads_q), 6))
        return Record(run_id=self.run_id, backend=backend.name, spec=spec, timing_mode=self.timing_mode,
                      device=str(self.device), env_id=self.env_id, seed=self.options.seed,
                      flops_convention=self.options.flops_convention, **fields)

    def run_case(self, spec: AttnSpec, backend: Backend, inputs: AttnInputs, *, check: bool = False) -> Record:
        """One case, start to finish; never raises for a failing backend."""
        reason = backend.supports(spec, self.device)
        if reason:
            return self._record(spec, backend, status="unsupported", reason=reason, info=backend.base_info())
        info: dict = backend.base_info()
        too_big = operators.of(spec).memory_guard(spec, backend, self.device)
        if too_big:
            return self._record(spec, backend, status="oom", reason=too_big, info=info)
        try:
            return self._measure_case(spec, backend, inputs, info, check)
        except BackendUnavailable as exc:
            return self._record(spec, backend, status="unsupported", reason=str(exc), info=info)
        except torch.OutOfMemoryError as exc:
            _free(self.device)
            return self._record(spec, backend, status="oom", reason=_first_line(exc), info=info)
        except Exception as exc:  # a failing kernel is a result, not the end of the sweep
            log.debug("case failed", exc_info=True)
            if host_out_of_memory(exc):  # the CPU allocator's refusal is an OOM too, not a kernel's error
                return self._record(spec, backend, status="oom", reason=_first_line(exc), info=info)
            if (limit := backend.build_limit(exc)) is not None and not self._context_lost():
                _free(self.device)
                return self._record(spec, backend, status="unsupported", reason=f"the installed build: {limit}",
                                    info=info)
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
            if self._context_lost():
                self.device_lost = True
                reason = f"{reason} (this left the CUDA context unusable; later cases ran in worker processes)"
            else:
                _free(self.device)
            return self._record(spec, backend, status="error", reason=reason, info=info)

    def _ready(self, spec: AttnSpec, backend: Backend, busy: bool) -> bool:
        """Whether the case can be timed now: its own compile is done, and it is not a long case while
        compile workers are running (``busy``)."""
        return not self.precompiler.pending(spec, backend.name) and not self._long_while_compiling(spec, busy)

    def _long_while_compiling(self, spec: AttnSpec, busy: bool) -> bool:
        """A compile worker is running and ``spec``'s call takes at least ``long_case_ms`` at the device's peak
        rate, or it is bound by memory and streams ``MEMORY_BOUND_MS`` or more of it. Each compile ends with
        calls of the compiled kernel on the same GPU, and a worker makes its case's inputs there: a long case
        takes few samples, so those calls move its median instead of showing as outliers (STA cases on an H100,
        2026-11-24: up to 2x slow with a tight spread); a memory-bound one shares the bandwidth with them for its
        whole sampling (a 64-request decode batch over 4k-32k keys on an H100, 2026-11-25: one kernel took 2.29 ms
        beside six workers and 1.84 ms beside two, its whole spread moved; another, timed after them, 1.79 ms)."""
        if not busy:
            return False
        if spec not in self._ideal_ms:
            op = operators.of(spec)
            compute = op.flops(spec) / (self.ceilings.tflops * 1e12) * 1e3
            memory = op.bytes_moved(spec) / (self.ceilings.gbps * 1e9) * 1e3
            self._ideal_ms[spec] = (compute, memory)
        compute, memory = self._ideal_ms[spec]
        return max(compute, memory) >= long_case_ms(self.options.timing, self.device.type) or \
            (memory > compute and memory >= MEMORY_BOUND_MS)

    def _release_inputs(self) -> bool:
        """Free the device memory of the previous shape; False when the CUDA context turned out lost."""
        try:
            _free(self.device)
            return True
        except Exception:
            if not self._context_lost():
                raise
            self.device_lost = True
            return False

    def _context_lost(self) -> bool:
        """Whether the device context is broken for good (every CUDA call now fails), after an error."""
        if self.device.type != "cuda":
            return False
        try:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        except Exception:  # an illegal address, a device-side assert: sticky until the process ends
            return True
        return False

    def _run_isolated(self, cases: list[tuple[AttnSpec, Backend]]) -> list[Record]:
        """Finish ``cases`` in worker processes (this process's CUDA context is lost)."""
        log.warning("the CUDA context of this process is lost; the remaining %d cases run in worker processes",
                    len(cases))
        # ceilings passed on: working them out would ask the lost context for the device name
        options = dataclasses.replace(self.options, ceilings=self.ceilings)
        isolated = IsolatedRunner(options, run_id=self.run_id, env_id=self.env_id, sink=self.sink,
                                  checker=self.checker, on_case=self.on_case)
        isolated.clock = self.clock  # the run's phase breakdown includes these cases
        return isolated.run_cases(cases, stopped=lambda: self.stop_requested)

    def _measure_case(self, spec, backend, inputs, info, check) -> Record:
        """Prepare, check, time; the case's wall seconds per phase go to ``info["wall_s"]``."""
        wall = info["wall_s"] = {}
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            baseline = torch.cuda.memory_allocated(self.device)
        with self.clock.phase("prepare", wall), nvtx_range("prepare", self.device):
            prepared = backend.prepare_case(spec, inputs)
            info.update(prepared.info)
            poison = getattr(self.checker, "poison", None) if check else None
            if cuda and poison is not None:
                # NaN-filled free memory, so elements the kernel never writes stay NaN (accuracy/check.py)
                poison(spec, self.device)
            if cuda:
                # Peak memory = what the call needs above what it is handed: the inputs and whatever
                # prepare built (packed copies, block masks, plans), which is recorded on its own.
                torch.cuda.synchronize(self.device)
                handed = torch.cuda.memory_allocated(self.device)
                info["prepare_mem_bytes"] = handed - baseline
                torch.cuda.reset_peak_memory_stats(self.device)
            outputs = prepared.checked_call()
            if cuda:
                torch.cuda.synchronize(self.device)
        self._count_compile(info, wall)
        peak = torch.cuda.max_memory_allocated(self.device) - handed if cuda else None
        bad = _non_finite(outputs)
        accuracy = checked = None
        if check and self.checker is not None:
            with self.clock.phase("check", wall), nvtx_range("check", self.device):
                accuracy = self.checker(spec, inputs, outputs, backend)
            checked = Outputs(**{k: t.detach() for k, t in outputs.tensors().items()})  # no autograd graph kept
        del outputs
        if bad:
            return self._record(spec, backend, status="nan", reason=f"non-finite values in {bad}", info=info,
                                peak_mem_bytes=peak, accuracy=accuracy)
        if self.precompiler.busy:
            info["compile_workers_busy"] = True
        ctx = self._timing_context()
        fresh = FreshInputs(spec, backend, inputs, prepared, seed=self.options.seed, dist=self.options.inputs) \
            if ctx.config.fresh_inputs else None
        with self.clock.phase("timing", wall), nvtx_range("timing", self.device):
            samples, timing_info = time_prepared(spec, backend, inputs, prepared, ctx, self.clocks, fresh)
        info.update(timing_info)
        if "cpu" in info and self.options.cpu is not None:
            info["cpu"] = info["cpu"] | {"cores": self.options.cpu.cores, "others_at_start": self.options.cpu.others}
        if accuracy is not None:
            with self.clock.phase("check", wall), nvtx_range("check", self.device):
                accuracy, bad = self._check_after_timing(spec, backend, inputs, prepared, accuracy, checked)
                if fresh is not None and not bad:
                    accuracy = fresh.check(self.checker, accuracy)
            del checked
        del fresh
        info["wall_s"] = {k: round(v, 4) for k, v in wall.items()}
        stats = summarize(samples)
        op = operators.of(spec)
        flop = op.flops(spec, convention=self.options.flops_convention, inputs=inputs)
        nbytes = op.bytes_moved(spec, inputs=inputs)
        info.update(op.info(spec, inputs))
        status = "ok"
        reason = None
        rates = {"iters_per_s": 1e3 / stats["median_ms"] if stats["median_ms"] > 0 else None,
                 "tflops": tflops_per_s(flop, stats["median_ms"]),
                 "gbps": gb_per_s(nbytes, stats["median_ms"])}
        cold = not cuda or (self.options.timing.cold_l2 and info.get("graph_cold") is not False)
        impossible = plausibility.check(tflops=rates["tflops"], gbps=rates["gbps"], info=info,
                                        exact=backend.judged_exactly(spec), cold_l2=cold, limits=self.ceilings)
        if bad:
            status, reason = "nan", f"non-finite values in {bad}"
        elif accuracy is not None and accuracy.get("verdict") == "fail":
            status, reason = "mismatch", accuracy.get("reason", "accuracy check failed")
            if "worst_request" in accuracy:  # a serving batch: which request is furthest off
                w = accuracy["worst_request"]
                reason += f"; worst request {w['index']} ({w['new']} new, {w['keys']} keys): out max_abs {w['max_abs']:.3g}"
        elif impossible:  # the time stays on record; no speed is derived from it
            status, reason = "implausible", f"{stats['median_ms']:.4g} ms: {impossible}"
            rates = dict.fromkeys(rates)
        return self._record(spec, backend, status=status, reason=reason, info=info, samples_ms=samples, **stats,
                            **rates, flops=flop, bytes=nbytes, peak_mem_bytes=peak, accuracy=accuracy)

    def _timing_context(self) -> CaseContext:
        return CaseContext(config=self.options.timing, device=self.device, seed=self.options.seed,
                           trace_dir=self.options.trace_dir, sessions=self.sessions,
                           backend_options=self.options.backend_options,
                           inputs=None if self.options.inputs.is_default else self.options.inputs.describe())

    def _check_after_timing(self, spec, backend, inputs, prepared, accuracy: dict,
                            checked: Outputs) -> tuple[dict, str | None]:
        """Two more calls after the timed ones: the first is checked too (a kernel right once and wrong
        later, from a stale cache or a race, fails here), and the two are compared bit for bit. A first
        call that returns the very bits of the checked call (in other memory) has its verdict, so only
        one that differs is compared with the reference again."""
        first = prepared.checked_call()
        second = prepared.checked_call()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        accuracy = dict(accuracy, repeat=repeat_agreement(first, second))
        bad = _non_finite(first)
        if bad:
            return accuracy, f"{bad} (a call after the timed calls)"
        if same_bits(first, checked):
            accuracy["repeat"].update(after_timing=accuracy["verdict"], same_as_checked=True)
            return accuracy, None
        after = self.checker(spec, inputs, first, backend)
        del first, second
        accuracy["repeat"]["after_timing"] = after["verdict"]
        if after["verdict"] in ("fail", "approx-fail") and accuracy["verdict"] not in ("fail", "approx-fail"):
            accuracy.update(verdict=after["verdict"], reason=f"a call after the timed calls: {after.get('reason')}",
                            tensors=after["tensors"], limits=after.get("limits", {}))
            if "worst" in after:
                accuracy["worst"] = after["worst"]
        return accuracy, None

    def _count_compile(self, info: dict, wall: dict) -> None:
        """Move a backend's reported compile time (info["compile_ms"]) from "prepare" to "compile"."""
        ms = info.get("compile_ms")
        if isinstance(ms, (int, float)) and ms > 0:
            for seconds in (self.clock.seconds, wall):
                seconds["compile"] = seconds.get("compile", 0.0) + ms / 1e3
                seconds["prepare"] = max(0.0, seconds.get("prepare", 0.0) - ms / 1e3)


class IsolatedRunner(Runner):
    """A Runner whose cases run in worker processes; records still go through ``sink`` in this process."""

    def __init__(self, *args, case_timeout: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if case_timeout is not None and not case_timeout > 0:
            raise ValueError(f"case timeout must be positive, got {case_timeout!r}")
        self.case_timeout = case_timeout
        self._worker: Worker | None = None
        self._setup = {"options": self.options, "run_id": self.run_id, "env_id": self.env_id,
                       "checker": self.checker}
        try:
            pickle.dumps(self._setup)
        except Exception as exc:
            raise ValueError(f"isolated runs need picklable options and a module-level checker: {exc}") from None

    def run(self, specs) -> list[Record]:
        return self.run_cases(self.cases(specs))

    def run_cases(self, cases, stopped: Callable[[], bool] | None = None) -> list[Record]:
        """Each (spec, backend) in a worker, stored through ``sink``; ``stopped`` (default: this runner's
        ``stop_requested``) is asked before each case."""
        stopped = stopped or (lambda: self.stop_requested)
        records: list[Record] = []
        try:
            for spec, backend in cases:
                if stopped():
                    break
                if self.on_case:
                    self.on_case(spec, backend.name)
                with self.clock.phase("isolated"):
                    record = self.run_isolated(spec, backend)
                self.sink(record)
                records.append(record)
        except BaseException:  # second Ctrl-C, a failing sink: do not wait for the case in flight
            self.close(kill=True)
            raise
        self.close()
        return records

    def run_isolated(self, spec: AttnSpec, backend: Backend) -> Record:
        """One case in a worker; a dead, hung or failing worker becomes this case's "error" record."""
        unsupported = backend.supports(spec, self.device)
        if unsupported:  # no worker makes the inputs of a case no backend takes
            return self._record(spec, backend, status="unsupported", reason=unsupported, info=backend.base_info())
        try:
            if self._worker is None:
                self._worker = Worker(self._setup, max(STARTUP_TIMEOUT_S, self.case_timeout or 0))
            self._worker.send({"spec": spec.to_dict(), "backend": backend.name})
            answer = self._worker.receive(self.case_timeout)
        except WorkerTimeout:
            self.close(kill=True)
            return self._record(spec, backend, status="error", reason=f"timed out after {self.case_timeout:g} s",
                                info=backend.base_info())
        except WorkerDied as exc:
            self.close()
            log.warning("%s %s: %s", backend.name, spec.label(), exc)
            return self._record(spec, backend, status="error", reason=str(exc), info=backend.base_info())
        record = Record.from_row(answer["row"])
        if record.status == "error":
            self.close()
        return record

    def close(self, kill: bool = False) -> None:
        """Stop the worker (if any)."""
        if self._worker is not None:
            worker, self._worker = self._worker, None
            worker.close(kill=kill)


INFINITE_ALLOWED = ("lse", "max_logits", "logits")
"""Output tensors where an infinity means "no key" (module code of ``_non_finite``)."""


def _non_finite(outputs: Outputs) -> str | None:
    """Comma list of output tensors holding NaN or Inf, or None."""
    # An LSE (and a row's largest logit) is +-inf on rows that attend no key (flash-attn writes +inf), an indexer's
    # logit -inf at a key its query may not see: only NaN is bad there.
    bad = [name for name, t in outputs.tensors().items() if t.is_floating_point()
           and not bool((~torch.isnan(t) if name in INFINITE_ALLOWED else torch.isfinite(t)).all())]
    return ", ".join(bad) or None


def same_bits(a: Outputs, b: Outputs) -> bool:
    """Whether ``a`` holds the same tensors, bit for bit, as ``b`` in memory of its own (a kernel writing
    every call into one buffer would otherwise be compared with itself)."""
    ta, tb = a.tensors(), b.tensors()
    if ta.keys() != tb.keys():
        return False
    for name, x in ta.items():
        y = tb[name]
        if x.shape != y.shape or x.dtype != y.dtype or _shares_memory(x, y) or not torch.equal(x, y):
            return False
    return True


def _shares_memory(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def repeat_agreement(a: Outputs, b: Outputs) -> dict:
    """Whether two calls on the same inputs returned the same bits: {deterministic, max_diff[, differs]}."""
    max_diff, differs = 0.0, []
    tb = b.tensors()
    for name, x in a.tensors().items():
        y = tb.get(name)
        if y is None or x.shape != y.shape:
            differs.append(name)
            max_diff = math.inf
            continue
        if not torch.equal(x, y):
            diff = (x.double() - y.double()).abs().nan_to_num(nan=math.inf).max()
            differs.append(name)
            max_diff = max(max_diff, float(diff))
    result = {"deterministic": not differs, "max_diff": max_diff}
    if differs:
        result["differs"] = differs
    return result


CPU_ALLOC_FAILURES = ("DefaultCPUAllocator: can't allocate memory", "alloc_cpu.cpp")
"""What the CPU allocator's RuntimeError says when a request is more than the host can give (it raises no
``torch.OutOfMemoryError``)."""


def host_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the CPU allocator refusing an allocation."""
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in CPU_ALLOC_FAILURES)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:400]


def _free(device: torch.device) -> None:
    # Only device memory needs the help: on CPU a full collection per shape (~30-100 ms with torch
    # loaded) dominated small sweeps, and reference counting already frees the tensors.
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()

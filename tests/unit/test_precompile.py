"""Compiling ahead in worker processes (attnbench.precompile), with a backend that marks where it ran."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from attnbench.backends.naive import NaiveBackend
from attnbench.inputs import InputDist
from attnbench.precompile import Precompiler, share_triton_cache, worker_count
from attnbench.spec import AttnSpec


class MarksItsProcess(NaiveBackend):
    """Naive attention whose prepare leaves a file named after the case and the process it ran in."""

    name = "test-marks-process"
    compiles_ahead = True

    def __init__(self, marks: str, fail_at: int | None = None):
        self.marks, self.fail_at = marks, fail_at

    def prepare(self, spec, inputs):
        if spec.seqlens_q[0] == self.fail_at:
            raise RuntimeError("no compiler for this shape")
        Path(self.marks, f"{spec.seqlens_q[0]}-{os.getpid()}").touch()
        return super().prepare(spec, inputs)


def _spec(s: int) -> AttnSpec:
    return AttnSpec(batch=1, seqlens_q=(s,), heads_q=2, head_dim=16, dtype="fp32")


def test_cases_are_prepared_in_worker_processes_and_waited_for(tmp_path, caplog):
    backend = MarksItsProcess(str(tmp_path), fail_at=33)
    specs = [_spec(s) for s in (17, 33, 77)]
    ahead = Precompiler([(s, backend) for s in specs], device="cpu", seed=0, inputs_dist=InputDist(), workers=2)
    with caplog.at_level(logging.INFO, logger="attnbench.precompile"):
        for spec in specs:
            ahead.wait(spec, backend.name)
        ahead.wait(_spec(5), backend.name)  # a case nobody compiled ahead: nothing to wait for
    ahead.close()
    marks = sorted(p.name.split("-") for p in tmp_path.iterdir())
    assert [m[0] for m in marks] == ["17", "77"]
    assert all(int(pid) != os.getpid() for _, pid in marks)
    assert "compiling test-marks-process b1 s33" in caplog.text and "no compiler for this shape" in caplog.text
    assert not ahead.busy
    assert len(ahead.seconds[backend.name]) == 2  # the failed compile is not counted
    assert ahead.summary().startswith("compiled ahead in 2 workers: test-marks-process 2 cases (longest ")


def test_no_workers_means_nothing_runs_ahead(tmp_path):
    backend = MarksItsProcess(str(tmp_path))
    ahead = Precompiler([(_spec(17), backend)], device="cpu", seed=0, inputs_dist=InputDist(), workers=0)
    ahead.wait(_spec(17), backend.name)
    ahead.close()
    assert ahead.pool is None and not list(tmp_path.iterdir())
    assert ahead.summary() is None


def test_worker_count_leaves_the_host_cores_to_the_main_process():
    assert worker_count(32, cpus=16) == 6
    assert worker_count(3, cpus=16) == 3
    assert worker_count(32, cpus=6) == 2
    assert worker_count(32, cpus=2) == 0


class _SlowBuild:
    """A precompiler whose build of one case finishes only after ``others`` other cases have run."""

    def __init__(self, slow: tuple[AttnSpec, str], runner, others: int):
        self.slow, self.runner, self.others = slow, runner, others
        self.waited_at: int | None = None

    def pending(self, spec, name):
        return (spec, name) == self.slow and len(self.runner.done) < self.others

    busy = False

    def wait(self, spec, name):
        if (spec, name) == self.slow:
            self.waited_at = len(self.runner.done)

    def close(self):
        pass


class _BusyWorkers:
    """Compile workers that keep running until ``drain`` (or until ``until`` cases have been timed)."""

    def __init__(self, runner, until: int = 10**9):
        self.runner, self.until, self.drained_at = runner, until, None

    @property
    def busy(self):
        return self.drained_at is None and len(self.runner.done) < self.until

    def drain(self):
        self.drained_at = len(self.runner.done)

    def pending(self, spec, name):
        return False

    def wait(self, spec, name):
        pass

    def close(self):
        pass


def test_a_case_still_compiling_waits_at_the_back_instead_of_blocking_the_run():
    from attnbench.runner import Runner, RunOptions
    from attnbench.timing import TimingConfig
    specs = [AttnSpec(batch=1, seqlens_q=(n,), heads_q=1, head_dim=8, dtype="fp32", pass_="fwd") for n in (16, 24)]
    done: list = []
    runner = Runner(RunOptions(device="cpu", backends=("naive", "sdpa-math"),
                               timing=TimingConfig(warmup=0, repeat=1, min_time_ms=0)), run_id="t", env_id=None,
                    sink=lambda record: done.append((record.spec.seqlens_q[0], record.backend)))
    runner.done = done
    slow = _SlowBuild((specs[0], "naive"), runner, others=2)
    runner._start_precompiler = lambda cases: slow
    runner.run(specs)
    assert runner.done[:2] == [(16, "sdpa-math"), (24, "naive")]  # timed while the build went on
    assert runner.done[-1] == (16, "naive") and len(runner.done) == 4 and slow.waited_at == 3
    slow_last = _SlowBuild((specs[0], "naive"), runner, others=99)  # nothing else left: it is waited for
    done.clear()
    runner._start_precompiler = lambda cases: slow_last
    runner.run(specs)
    assert runner.done[-1] == (16, "naive") and len(runner.done) == 4


def test_a_long_case_is_timed_after_the_compile_workers_not_beside_them():
    from attnbench.plausibility import Ceilings
    from attnbench.runner import Runner, RunOptions, long_case_ms
    from attnbench.timing import TimingConfig
    timing = TimingConfig(warmup=0, repeat=1, min_time_ms=0)
    LONG_CASE_MS = long_case_ms(timing, "cpu")
    short = AttnSpec(batch=1, seqlens_q=(16,), heads_q=1, head_dim=8, dtype="fp32")
    long_ = AttnSpec(batch=1, seqlens_q=(64,), heads_q=1, head_dim=8, dtype="fp32")
    # a pretend device so slow that the 64-token case needs more than LONG_CASE_MS at its peak, 16 tokens less
    from attnbench import metrics
    tflops = metrics.flops(long_) / (LONG_CASE_MS * 2 * 1e-3) / 1e12
    assert metrics.flops(short) / (tflops * 1e12) * 1e3 < LONG_CASE_MS
    done: list = []
    runner = Runner(RunOptions(device="cpu", backends=("naive",), ceilings=Ceilings(tflops, 1e3, "test"),
                               timing=timing), run_id="t", env_id=None,
                    sink=lambda record: done.append(record.spec.seqlens_q[0]))
    runner.done = done
    workers = _BusyWorkers(runner, until=2)            # they finish after two cases were timed
    runner._start_precompiler = lambda cases: workers
    runner.run([long_, short, short.replace(seqlens_q=(24,))])
    assert done == [16, 24, 64] and workers.drained_at is None
    done.clear()
    workers = _BusyWorkers(runner)                     # still running when only the long case is left
    runner._start_precompiler = lambda cases: workers
    runner.run([long_, short])
    assert done == [16, 64] and workers.drained_at == 1


def test_a_memory_bound_case_is_timed_after_the_compile_workers_not_beside_them():
    # the workers make their cases' inputs and call their kernels on the same GPU: a decode batch that streams its
    # cache shares the bandwidth with them for its whole sampling (an H100: 2.29 ms beside six workers, 1.84 beside two)
    from attnbench import metrics
    from attnbench.plausibility import Ceilings
    from attnbench.runner import MEMORY_BOUND_MS, Runner, RunOptions
    from attnbench.timing import TimingConfig
    timing = TimingConfig(warmup=0, repeat=1, min_time_ms=0)
    small = AttnSpec(batch=1, seqlens_q=(16,), heads_q=1, head_dim=8, dtype="fp32")
    streaming = AttnSpec(batch=1, seqlens_q=(1,), seqlens_k=(4096,), heads_q=1, head_dim=64, dtype="fp32")
    # a pretend device whose compute is endless and whose bandwidth makes the decode need 2x MEMORY_BOUND_MS
    gbps = metrics.bytes_moved(streaming) / (2 * MEMORY_BOUND_MS * 1e-3) / 1e9
    assert metrics.bytes_moved(small) / (gbps * 1e9) * 1e3 < MEMORY_BOUND_MS
    done: list = []
    runner = Runner(RunOptions(device="cpu", backends=("naive",), ceilings=Ceilings(1e9, gbps, "test"),
                               timing=timing), run_id="t", env_id=None,
                    sink=lambda record: done.append(record.spec.seqlens_k[0]))
    runner.done = done
    workers = _BusyWorkers(runner)                     # still running when only the decode is left
    runner._start_precompiler = lambda cases: workers
    runner.run([streaming, small])
    assert done == [16, 4096] and workers.drained_at == 1


class ReportsTritonCache(NaiveBackend):
    """Naive attention whose prepare writes the Triton cache directory its process sees."""

    name = "test-reports-triton-cache"
    compiles_ahead = True

    def __init__(self, report: str):
        self.report = report

    def prepare(self, spec, inputs):
        Path(self.report).write_text(os.environ.get("TRITON_CACHE_DIR", "unset"))
        return super().prepare(spec, inputs)


def test_the_workers_and_the_main_process_share_one_triton_cache(tmp_path, monkeypatch):
    pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    report = tmp_path / "seen"
    backend = ReportsTritonCache(str(report))
    ahead = Precompiler([(_spec(17), backend)], device="cpu", seed=0, inputs_dist=InputDist(), workers=1)
    ahead.wait(_spec(17), backend.name)
    ahead.close()
    # inductor's own directory for the device, set here before the worker started: the worker saw it too
    assert os.environ["TRITON_CACHE_DIR"] == triton_cache_dir(0) == report.read_text()


def test_the_shared_triton_cache_is_the_devices_own(monkeypatch):
    pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    second = triton_cache_dir(1)
    assert second.endswith("1") and second != triton_cache_dir(0)
    assert share_triton_cache("cuda:1") == second == os.environ["TRITON_CACHE_DIR"]


def test_a_triton_cache_the_user_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert share_triton_cache("cuda:1") == str(tmp_path / "mine") == os.environ["TRITON_CACHE_DIR"]

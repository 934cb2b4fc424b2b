"""Compiling ahead in worker processes (attnbench.precompile), with a backend that marks where it ran."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from attnbench.backends.naive import NaiveBackend
from attnbench.inputs import InputDist
from attnbench.precompile import Precompiler, worker_count
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

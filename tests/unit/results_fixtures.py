"""Result databases for the plot, report, export and compare tests: one real CPU run, synthetic runs."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

SRC = str(Path(__file__).resolve().parents[2] / "src")
CPU_RUN = "cpu-run"
SYNTH_RUN = "synthetic-gpu"
HOSTILE = "<script>alert('x')</script> & \"quoted\""


def cpu_specs() -> list[AttnSpec]:
    """Small cases that vary every plot axis except sparsity (odd lengths included)."""
    base = dict(heads_q=2, head_dim=8, dtype="fp32")
    specs = [AttnSpec(seqlens_q=(s,), causal=c, pass_=p, **base)
             for s in (16, 33, 64) for c in (False, True) for p in ("fwd", "fwd_bwd")]
    specs += [AttnSpec(seqlens_q=(16,) * n, pass_="fwd", **base) for n in (2, 3)]
    specs += [AttnSpec(seqlens_q=(16,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd"),
              AttnSpec(seqlens_q=(16,), heads_q=4, head_dim=8, dtype="fp32", pass_="fwd")]
    return specs


def make_cpu_run(db: Path) -> None:
    """A real, checked run of naive and sdpa-flash on CPU (sdpa-flash skips the grouped cases: unsupported)."""
    from attnbench.accuracy.check import AccuracyChecker
    options = RunOptions(device="cpu", backends=("naive", "sdpa-flash"), timing=TimingConfig(warmup=1, repeat=3))
    with ResultStore(db) as store:
        store.start_run(CPU_RUN, command="attnbench run (test)", config={}, env_id=None, version="test")
        Runner(options, run_id=CPU_RUN, env_id=None, sink=store.write,
               checker=AccuracyChecker(grads_ahead=True)).run(cpu_specs())
        store.finish_run(CPU_RUN)


def synthetic_record(run_id: str, spec: AttnSpec, backend: str, samples: list[float], **fields) -> Record:
    median = float(np.median(samples))
    return Record(run_id=run_id, backend=backend, spec=spec, timing_mode="events", device="cuda:0",
                  samples_ms=list(samples), median_ms=median, n=len(samples), tflops=fields.pop("tflops", 1.0 / median),
                  gbps=fields.pop("gbps", 10.0 / median), **fields)


def make_synthetic_run(db: Path) -> None:
    """GPU-like records written straight through the store: peak memory, sparsity, accuracy, an error.
    One run per target sparsity (a run holds one record per case): SYNTH_RUN, then SYNTH_RUN-s50, -s75."""
    rng = np.random.default_rng(0)
    runs = {0.25: SYNTH_RUN, 0.5: SYNTH_RUN + "-s50", 0.75: SYNTH_RUN + "-s75"}
    with ResultStore(db) as store:
        for run_id in runs.values():
            store.start_run(run_id, command="synthetic", config={}, env_id=None, version="test")
        for s in (1024, 2048, 4096):
            for sparsity, run_id in runs.items():
                spec = AttnSpec(seqlens_q=(s,), heads_q=4, head_dim=64, dtype="bf16", pass_="fwd")
                samples = list(rng.normal(s / 1024 * (1 - sparsity), 0.01, 9))
                store.write(synthetic_record(run_id, spec, "sparse-test",
                                             samples, peak_mem_bytes=s * 2**16, info={"target_sparsity": sparsity},
                                             accuracy={"verdict": "pass", "tensors": {"out": {"max_abs": 1e-3, "rel_l2": 2e-3}}}))
        spec = AttnSpec(seqlens_q=(8192,), heads_q=4, head_dim=64, dtype="bf16", pass_="fwd")
        store.write(Record(run_id=SYNTH_RUN, backend="broken", spec=spec, status="error", reason=HOSTILE))
        for run_id in runs.values():
            store.finish_run(run_id)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args) -> CliResult:
    """Run the CLI in this process (fast: torch is imported once), capturing its output and exit status."""
    from attnbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


def attnbench(*args, cwd=None, timeout=300):
    """Run the checkout's CLI in a subprocess, as a user would."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attnbench", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)

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


DEFAULT_SWEEP_RUN = "default-sweep"
EXACT = ("naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-varlen", "fa2", "fa2-qkvpacked",
         "fa2-kvpacked", "fa2-varlen", "fa2-varlen-qkvpacked", "fa3", "fa3-varlen", "flex")
APPROX = ("sage", "sage-varlen", "sage2-fp8", "sage2-fp8-sm90", "sage2-fp16", "sparge", "sparge-cdf", "sparge-fp16",
          "sparge-fp16-cdf")


def make_default_sweep_run(db: Path) -> int:
    """Records of the shape of the H100 default sweep (``attnbench run`` with 23 backends: S = 128..16k, causal and
    not, fwd and fwd_bwd at b2 h16 d128 bf16; 736 records): the exact kernels, the approximate ones (forward
    only; two without causal; SpargeAttn's with the sparsity it reached), sdpa-math out of memory at 16k, each with
    the info, accuracy, CI and clocks a GPU record holds. Returns the number of records."""
    rng = np.random.default_rng(1)
    tensors = {name: {"max_abs": 0.0127, "mean_abs": 4.6e-4, "rel_l2": 4.3e-3, "cosine": 0.99999, "rel_l1": 4.1e-3,
                      "rmse": 6.2e-4, "nonfinite": 0, "numel": 524288, "dtype": "bfloat16"}
               for name in ("out", "lse", "dq", "dk", "dv")}
    written = 0
    with ResultStore(db) as store:
        store.start_run(DEFAULT_SWEEP_RUN, command="attnbench run", config={}, env_id=None, version="test")
        for i, backend in enumerate(EXACT + APPROX):
            exact = backend in EXACT
            for causal in (False, True):
                for pass_ in ("fwd", "fwd_bwd"):
                    for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
                        spec = AttnSpec(batch=2, seqlens_q=(s,), heads_q=16, head_dim=128, dtype="bf16",
                                        causal=causal, pass_=pass_)
                        info = {"backend": backend, "package": "torch", "version": "2.11.0+cu130", "exact": exact,
                                "kernel": f"{backend} kernel", "wall_s": {"prepare": 0.29, "check": 0.86}}
                        why = ("forward only (no backward)" if not exact and pass_ != "fwd" else
                               "causal not offered: its FP8-PV kernel" if causal and backend in ("sparge", "sparge-cdf")
                               else None)
                        if why or (backend == "sdpa-math" and s == 16384):
                            status = "unsupported" if why else "oom"
                            store.write(Record(run_id=DEFAULT_SWEEP_RUN, backend=backend, spec=spec,
                                               timing_mode="events", device="cuda:0", status=status,
                                               reason=why or "needs 34.1 GiB, 22.0 GiB free (estimated; not run)",
                                               info=info))
                            written += 1
                            continue
                        ms = 1e-3 * (s / 128) ** 1.7 * (1 + 0.15 * i) * (3.5 if pass_ != "fwd" else 1)
                        samples = list(rng.normal(ms, ms * 0.01, 60))
                        median = float(np.median(samples))
                        info |= {"median_ci95_ms": [median * 0.995, median * 1.005],
                                 "gpu_state": {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1980}},
                                 "outliers": {"low": 1, "high": 2}}
                        if backend.startswith("sparge"):  # the blocks it skipped: figures against sparsity too
                            info["sparsity"] = round(0.05 * s.bit_length() - 0.35, 3)
                        names = ("out", "lse") if pass_ == "fwd" else tuple(tensors)
                        accuracy = ({"verdict": "pass", "exact": True, "tensors": {n: tensors[n] for n in names}}
                                    if exact else {"verdict": "approx-pass", "exact": False,
                                                   "tensors": {"out": tensors["out"]}})
                        store.write(synthetic_record(DEFAULT_SWEEP_RUN, spec, backend, samples, info=info,
                                                     accuracy=accuracy, peak_mem_bytes=s * 2**14,
                                                     tflops=s / 128 / median, gbps=s / median))
                        written += 1
        store.finish_run(DEFAULT_SWEEP_RUN)
    return written


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

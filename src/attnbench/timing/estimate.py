"""How long a CPU sweep will take, worked out before it runs, so that one of minutes is announced, not discovered.

A CPU case of plain attention math can take minutes (a bf16 serving batch on a CPU without bf16 instructions,
a DeepSeek-V3 decode step), and a sweep of them is better cut down before it starts than stopped after. What a
case costs is its calls times the time of one call:

- **calls**: the timing policy's (``TimingConfig``): the call ``prepare`` checks, the warm-up (one call, more
  while they fit a quarter of the time cap), at least ``MIN_SAMPLES`` samples and up to the time cap, and with
  the accuracy check two calls after the timing: 14 calls for a call of a second or more.
- **one call**: the longer of its dense FLOPs (naive and math kernels compute every (query, key) pair) at the
  rate plain attention math (q·kᵀ, softmax, ·v; ``PROBE_SHAPE``) reaches here in the case's dtype, and the
  bytes plain math writes and reads again (the keys and values repeated for every query head, the score and
  probability matrices) at the rate fresh memory is filled here (``FRESH_BYTES``, page faults included). The
  dtype moves the first most (a 2-core AMD EPYC with AVX-512 bf16, one thread, 2026-11-28: fp32 ~70, bf16
  ~120, fp16 ~5 GFLOP/s); the second is what makes a DeepSeek-V3 decode step (one latent KV head for 128 query
  heads) take 1.7 s a call for 1.1 GFLOP there.

The other operators' cases are estimated the same way, from their own FLOP count (``flops(spec)``) at the share
of plain math's rate their CPU kernels reach (the operator's ``cpu_share``: a recurrence's token loop, a sparse
case's gathered rows) and the bytes they move at the fresh-memory rate; a dtype plain math has no kernel for here
(the indexer's fp8) is taken at fp32's rate, as those kernels compute it.

``probe`` measures both rates in about 0.1 s, with the threads the run times with. They are the rates of plain
math at its best, so the estimate is about the least a sweep takes; the kernels' own overheads (layout copies,
masks, a request at a time), the exact reference of the check and a case timed again after other processes
preempted it (``timing.case``) made the sweeps measured take 1.2-9x that (``SLOWER``): the warning gives a range.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from attnbench import metrics
from attnbench.spec import AttnSpec
from attnbench.timing.config import MIN_SAMPLES, TimingConfig

PROBE_SHAPE = (4, 256, 64)
"""Heads, tokens, head size of the attention math ``probe`` times (67 MFLOP: 1 ms at 70 GFLOP/s, 15 ms at 5)."""
FRESH_BYTES = 48 << 20
"""Bytes ``probe`` copies into fresh memory: above glibc's largest mmap threshold (32 MiB), so each copy gets
pages the kernel must fault in, as the large repeated keys and score matrices of plain math do."""
SLOWER = 4.0
"""How many times the estimate a sweep may well take, the upper end of the range the warning gives. On the 2-core
EPYC (2026-11-28, another process busy) the default fp32 sweep took 1.2x the estimate, 12 bf16 cases of S=1024
3x, the DeepSeek-V3 decode step of ``--preset deepseek-v3 --batch 4q1kv1k`` 5x (107 s for 20) and a small bf16
serving batch 4-9x (2-5 s: naive's strided bf16 copies took 67 of its 97 ms a call). A larger factor would warn
of the default CPU sweep (7 s) whenever a busy CPU halves the probe's rates."""
WARN_S = 60.0
"""A sweep that may well take longer than this (``SLOWER`` times the estimate) is announced before it starts."""
LONG_S = 600.0
"""A sweep estimated to take at least this long (the estimate itself, the least it should take) is a GPU's work:
on a CPU, ``attnbench run`` refuses it unless ``--allow-long`` is given. The default CPU sweep is estimated at a
few seconds; a model preset at its sequence lengths at hours."""
FALLBACK_DTYPE = "fp32"
"""The rate a case in a dtype ``probe`` could not time is estimated at (other operators than attention)."""


@dataclass(frozen=True)
class Rates:
    """What ``probe`` measured on this CPU."""

    flops: dict[str, float]
    """dtype name -> FLOP/s of plain attention math in it (a dtype the CPU cannot compute in is absent)."""
    fresh_bytes: float
    """Bytes per second written into fresh memory."""
    threads: int
    """torch threads the probe ran with (the run's)."""


def _best_seconds(fn, repeats: int = 3) -> float:
    fn()  # the first call starts the thread pool and allocates
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def probe(dtypes: Iterable[str]) -> Rates:
    """The rates of ``dtypes``' plain attention math and of fresh memory here, with torch's current threads."""
    import torch

    from attnbench.spec import DTYPES
    heads, tokens, dim = PROBE_SHAPE
    flops = {}
    for name in dict.fromkeys(dtypes):
        try:
            q, k, v = (torch.randn(1, heads, tokens, dim).to(DTYPES[name]) for _ in range(3))
            seconds = _best_seconds(lambda q=q, k=k, v=v: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
        except (RuntimeError, TypeError, KeyError):  # a dtype the CPU has no matmul for (fp8): its cases do not run
            continue
        flops[name] = 4.0 * heads * tokens * tokens * dim / seconds
    source = torch.empty(FRESH_BYTES, dtype=torch.uint8).fill_(1)
    fresh = FRESH_BYTES / _best_seconds(source.clone)
    return Rates(flops=flops, fresh_bytes=fresh, threads=torch.get_num_threads())


def plain_math_bytes(spec: AttnSpec) -> float:
    """Bytes plain math writes and reads again in one call: the keys and values repeated for every query head
    (grouped heads), the score and probability matrices; in proportion to the FLOPs for a backward."""
    elem = spec.torch_dtype.itemsize
    repeated = spec.head_dim + spec.head_dim_v if spec.heads_kv < spec.heads_q else 0
    per_head = sum(sk * repeated + 2 * sq * sk for sq, sk in spec.sequences)
    return 2 * spec.heads_q * per_head * elem * metrics.PASS_FLOP_FACTOR[spec.pass_]  # each written, then read


def probe_dtypes(specs: Iterable) -> set[str]:
    """The dtypes ``probe`` should time for ``specs``: theirs, and ``FALLBACK_DTYPE`` for another operator's."""
    dtypes = {spec.dtype for spec in specs}
    if any(not isinstance(spec, AttnSpec) for spec in specs):
        dtypes.add(FALLBACK_DTYPE)
    return dtypes


def call_seconds(spec, rates: Rates) -> float | None:
    """Seconds of one call of ``spec`` here (module docstring); None for an attention dtype ``probe`` could not
    time (a CPU without the kernel: the case does not run)."""
    from attnbench import operators
    op = operators.of(spec)
    rate = rates.flops.get(spec.dtype)
    if isinstance(spec, AttnSpec):
        if rate is None:
            return None
        moved = plain_math_bytes(spec)
    else:
        rate = rate or rates.flops.get(FALLBACK_DTYPE)
        if rate is None:
            return None
        moved = op.bytes_moved(spec)
    return max(op.flops(spec, convention="dense") / (rate * op.cpu_share), moved / rates.fresh_bytes)


def calls(call_s: float, timing: TimingConfig, check: bool) -> float:
    """Calls a CPU case of ``call_s`` a call makes under ``timing`` (module docstring)."""
    call_ms, cap_ms = max(call_s * 1e3, 1e-6), timing.max_time_for("cpu")
    warmup = 1 + timing.warmup_calls(call_ms, "cpu") if timing.warmup else 0
    sampled_ms = max(MIN_SAMPLES * call_ms, min(max(timing.repeat * call_ms, timing.min_time_for("cpu")), cap_ms))
    return 1 + warmup + sampled_ms / call_ms + (2 if check else 0)


def case_seconds(spec, rates: Rates, timing: TimingConfig, check: bool) -> float | None:
    """Seconds the case should take here (None: unknown)."""
    call_s = call_seconds(spec, rates)
    if call_s is None:
        return None
    return call_s * calls(call_s, timing, check)


@dataclass(frozen=True)
class Estimate:
    """A sweep's expected CPU time and what it rests on."""

    seconds: float
    cases: int
    """Cases counted (those a backend takes, in a dtype the probe timed)."""
    total: int
    """The run's cases, as its progress counts them (those counted, those refused here, those not estimated)."""
    calls: float
    flop: float
    """Dense FLOPs of all those calls."""
    rates: Rates


def sweep(cases: Iterable, rates: Rates, timing: TimingConfig, check: bool, total: int | None = None) -> Estimate:
    """The estimate of running ``cases`` (one spec per case that will run: a backend takes it, the memory guard
    lets it start) here, of a run of ``total`` cases (default: these)."""
    from attnbench import operators
    seconds = n_calls = flop = 0.0
    counted = seen = 0
    for spec in cases:
        seen += 1
        call_s = call_seconds(spec, rates)
        if call_s is None:
            continue
        n = calls(call_s, timing, check)
        counted, seconds, n_calls = counted + 1, seconds + n * call_s, n_calls + n
        flop += n * operators.of(spec).flops(spec, convention="dense")
    return Estimate(seconds=seconds, cases=counted, total=seen if total is None else total, calls=n_calls, flop=flop,
                    rates=rates)


def duration(seconds: float) -> str:
    """'<1 s', '40 s', '4 min', '2.5 h', '840 h' (a tenth of an hour only below 10 h)."""
    if seconds < 0.5:
        return "<1 s"
    if seconds < 99.5:
        return f"{seconds:.0f} s"
    if seconds < 99.5 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 9.95 * 3600 else f"{seconds / 3600:.0f} h"


def span(low: float, high: float) -> str:
    """'20–80 s', '1–4 min', '40 s–3 min', 'up to 2 s': ``low`` in ``high``'s unit where it is one or more."""
    b = duration(high)
    if low < 0.5:
        return b if b == "<1 s" else f"up to {b}"
    unit = b.split()[1]
    scale = {"s": 1, "min": 60, "h": 3600}[unit]
    if low / scale < 0.95:
        return f"{duration(low)}–{b}"
    a = f"{low / scale:.1f}" if unit == "h" and high < 9.95 * 3600 else f"{low / scale:.0f}"
    return b if f"{a} {unit}" == b else f"{a}–{b}"


def warning(estimate: Estimate, threshold_s: float = WARN_S) -> str | None:
    """The line announcing a sweep that may well take more than ``threshold_s`` (``SLOWER`` times the estimate),
    with what the estimate rests on; None for a shorter one."""
    if estimate.seconds * SLOWER < threshold_s:
        return None
    rates = estimate.rates
    math_rates = ", ".join(f"{name} {rate / 1e9:.3g} GFLOP/s" for name, rate in rates.flops.items())
    threads = f"{rates.threads} thread{'s' * (rates.threads != 1)}"
    return (f"attnbench: this sweep may take {span(estimate.seconds, estimate.seconds * SLOWER)} on this CPU: "
            f"{counted(estimate)}, ~{estimate.calls:,.0f} calls, "
            f"{estimate.flop / 1e9:,.0f} GFLOP at the rates plain attention math reached here ({math_rates}, fresh "
            f"memory {rates.fresh_bytes / 1e9:.2g} GB/s, {threads}), kernels up to {SLOWER:g}x slower; smaller "
            "--seq-lens, --batch-size or --batch run sooner, Ctrl-C stops it")


def counted(estimate: Estimate) -> str:
    """'12 cases', or '40 of its 60 cases' where the others are refused here or cannot be estimated."""
    cases = f"{estimate.cases} case{'s' * (estimate.cases != 1)}"
    if estimate.total == estimate.cases:
        return cases
    return f"{estimate.cases} of its {estimate.total} cases"


def refusal(estimate: Estimate, threshold_s: float = LONG_S) -> str | None:
    """Why a sweep estimated at ``threshold_s`` or more (the least it should take) is not started on this CPU
    without ``--allow-long``: what it would cost here, in a line that fits 100 columns; None for a shorter one."""
    if estimate.seconds < threshold_s:
        return None
    return f"a GPU-sized command: {span(estimate.seconds, estimate.seconds * SLOWER)} on this CPU; --allow-long runs it"

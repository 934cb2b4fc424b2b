"""How much of the host's CPU a CPU timing gets: the thread count to use, and whether a case was disturbed.

On a CPU that other processes share, a multi-threaded torch call waits for its slowest thread, and a thread
that loses its core waits for the next scheduler tick (4 ms at 250 Hz): with one of two cores busy elsewhere, a
0.2 ms call measured 7.8 ms with two threads and 0.24 ms with one (2026-11-25, 2-core CI machine), and every
sample lost whole ticks, so the spread looked tight. Two defences:

- ``plan`` chooses the thread count before the run: the cores this process may use (affinity, cgroup quota)
  less those other processes keep busy (``/proc/stat`` over a short look), never more than torch would use.
- ``Preemptions`` counts, per sample, whether the process was switched out involuntarily (``getrusage``'s
  ``ru_nivcsw``: under a microsecond to read), and per case how long its threads waited for a core and how
  much CPU time other processes used. A preempted case (``was_preempted``) is timed again, with fewer
  threads when other processes took cores meanwhile; one still preempted, or timed while others used a
  core's worth (``BUSY_CORE``), is marked busy in its record (``is_busy``): the views mark it and
  ``compare`` calls no regression on it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

BUSY_SHARE = 0.25
"""A case is busy when at least this share of its samples were preempted... The median stays a clean sample
until half are hit, but by a quarter the upper quantiles are inflated and the median has moved to the clean
samples' upper third (at S=512, 39% hit: median +4%, p90 2.2x)."""
BUSY_WAIT = 0.02
"""... and its threads waited for a core at least this share of the measured time (Linux's schedstat; a
13 ms sample is often switched out for a moment that costs nothing measurable)."""
HEAVY_WAIT = 0.10
"""Waiting this share of the measured time marks a case busy however few samples it hit (two threads, one
core taken elsewhere: 21% of the samples preempted, waits 45% of the time, p90 3.6x the median)."""
MIN_JUDGED = 3
"""Fewest samples to judge a case by (``verify``'s single timed call is not judged; an ``e2e`` run's three
steps are)."""
BUSY_CORE = 0.6
"""Cores' worth of CPU time other processes use from which a core counts as taken, when the run chooses its
threads and when a case is judged (0.4 of a core busy elsewhere already costs a thread scheduled there whole
ticks)."""
LOOK_S = 0.25
"""How long ``others_busy`` watches /proc/stat (its jiffies are 10 ms)."""


@dataclass(frozen=True, kw_only=True)
class CpuPlan:
    """The CPU threads a run times with, and why."""

    threads: int
    """torch intra-op threads for the run."""
    cores: int
    """Cores this process may use (affinity, capped by a cgroup CPU quota)."""
    others: float | None = None
    """Cores' worth of CPU time other processes used when the run started (None: not measured)."""
    given: bool = False
    """The thread count was given (--threads), not chosen."""


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 quota (``cpu.max``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _busy_jiffies() -> tuple[int, int] | None:
    """(non-idle jiffies of the CPUs this process may use, this process's own jiffies), or None off Linux."""
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        busy = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name in allowed:  # user nice system idle iowait irq softirq steal ...
                values = [int(v) for v in fields[:8]]
                busy += sum(values) - values[3] - values[4]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return busy, int(own[11]) + int(own[12])  # utime, stime
    except (AttributeError, OSError, ValueError, IndexError):
        return None


def others_busy(seconds: float = LOOK_S) -> float | None:
    """Cores' worth of CPU time that other processes used over the next ``seconds`` (None off Linux)."""
    first = _busy_jiffies()
    t0 = time.perf_counter()
    time.sleep(seconds)
    last = _busy_jiffies()
    if first is None or last is None:
        return None
    ticks = (last[0] - first[0]) - (last[1] - first[1])
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t0))


def threads_for(cores: int, others: float | None, most: int) -> int:
    """Threads that get a core each: ``cores`` less those taken elsewhere, at most ``most``, at least 1."""
    taken = 0 if others is None else math.floor(others + 1 - BUSY_CORE)
    return max(1, min(most, cores - taken))


def plan(threads: int | None = None) -> CpuPlan:
    """The run's CPU threads: ``threads`` when given, else one per core not busy elsewhere (at most torch's
    default, which OMP_NUM_THREADS sets)."""
    import torch
    cores = usable_cores()
    if threads is not None:
        return CpuPlan(threads=threads, cores=cores, given=True)
    others = others_busy()
    return CpuPlan(threads=threads_for(cores, others, torch.get_num_threads()), cores=cores,
                   others=None if others is None else round(others, 2))


def involuntary_switches() -> int | None:
    """Times this process's threads were switched out while runnable (all threads; None where unknown)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def run_delay_ms() -> float | None:
    """Milliseconds this process's threads have spent runnable but waiting for a core (Linux; None elsewhere)."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                total += int(Path(f"/proc/self/task/{task}/schedstat").read_text().split()[1])
            except FileNotFoundError:  # the thread ended meanwhile
                continue
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e6


class Preemptions:
    """Counts, over the samples of one measurement, those the process was switched out in (``before`` and
    ``after`` bracket a sample, outside its timed region), how long its threads waited for a core, and how
    much CPU time other processes used meanwhile."""

    def __init__(self) -> None:
        self.known = involuntary_switches() is not None
        self.delay = run_delay_ms()
        self.jiffies, self.start = _busy_jiffies(), time.perf_counter()
        self.samples = self.hit = 0

    def before(self) -> int:
        return involuntary_switches() if self.known else 0

    def after(self, before: int) -> None:
        self.samples += 1
        self.hit += self.known and involuntary_switches() > before

    def info(self, measured_ms: float) -> dict:
        """The record's ``info["cpu"]``: threads, cores, samples, preempted, waited_ms, measured_ms, others
        (cores' worth of CPU time other processes used while the samples were taken) and busy."""
        import torch
        end, jiffies, elapsed = run_delay_ms(), _busy_jiffies(), time.perf_counter() - self.start
        waited = None if self.delay is None or end is None else round(end - self.delay, 3)
        others = None
        if self.jiffies is not None and jiffies is not None and elapsed >= MIN_LOOK_S:
            ticks = (jiffies[0] - self.jiffies[0]) - (jiffies[1] - self.jiffies[1])
            others = round(max(0.0, ticks / os.sysconf("SC_CLK_TCK") / elapsed), 2)
        cpu = {"threads": torch.get_num_threads(), "cores": usable_cores(), "samples": self.samples,
               "preempted": self.hit if self.known else None, "waited_ms": waited, "measured_ms": round(measured_ms, 3),
               "others": others}
        return cpu | {"busy": is_busy(cpu)}


MIN_LOOK_S = 0.05
"""Shortest measurement whose others' CPU time is judged (/proc/stat counts in 10 ms jiffies)."""


def was_preempted(cpu: dict | None) -> bool:
    """Whether the samples of a case (``info["cpu"]``) were switched out enough to be wrong: see BUSY_SHARE,
    BUSY_WAIT and HEAVY_WAIT. Timing again may help."""
    cpu = cpu or {}
    n, hit, waited = cpu.get("samples") or 0, cpu.get("preempted"), cpu.get("waited_ms")
    if hit is None or n < MIN_JUDGED:
        return False
    if waited is None:  # no schedstat (not Linux): the preempted samples alone
        return hit >= BUSY_SHARE * n
    wait = waited / max(cpu.get("measured_ms") or 0.0, 1e-9)
    return wait >= BUSY_WAIT and (hit >= BUSY_SHARE * n or wait >= HEAVY_WAIT)


def is_busy(cpu: dict | None) -> bool:
    """Whether a case (``info["cpu"]``) was timed on a busy CPU: its samples were preempted, or other processes
    kept a core's worth busy meanwhile (BUSY_CORE), which slows a kernel without preempting it (shared caches,
    memory bandwidth, a sibling hyperthread: one run against another then moves 5-20% with one thread and
    no preempted sample, 2026-11-25)."""
    others = (cpu or {}).get("others")
    return was_preempted(cpu) or (others is not None and others >= BUSY_CORE)


def disturbance(cpu: dict) -> tuple[bool, float, float]:
    """Sort key of a measurement's CPU info: busy first, then the share of time waited, of samples hit."""
    waited = (cpu.get("waited_ms") or 0.0) / max(cpu.get("measured_ms") or 0.0, 1e-9)
    return is_busy(cpu), waited, (cpu.get("preempted") or 0) / max(cpu.get("samples") or 1, 1)


def relieve() -> tuple[int, int]:
    """After a busy case: fewer threads when other processes now take cores. (threads before, after)."""
    import torch
    before = torch.get_num_threads()
    after = threads_for(usable_cores(), others_busy(), before)
    if after < before:
        torch.set_num_threads(after)
    return before, after

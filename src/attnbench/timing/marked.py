"""A launch sequence whose kernel trace can be cut into iterations without trusting kernel names.

Profilers (torch.profiler, Nsight Compute, rocprofv3) report a flat, ordered list of device kernels.
To turn it into per-iteration times, each block of iterations is launched as::

    [F] M                     prelude: teaches the parser the exact names of F and M
    ([F] M  fn-kernels...) x K
    [F] M                     terminator

and several blocks (cases) may follow each other in one trace. F is the L2 flush (only with a cold
L2) and M a one-element ``bitwise_not`` on int32, a kernel no attention closure launches. The parser
learns both names from the first kernels, splits at M, and drops the F that ends each segment *by
position*, so a closure may itself launch fill kernels with the same name as the flush without being
miscounted. Any mismatch raises instead of guessing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

TIMED_RANGE = "attnbench_timed"
"""NVTX/roctx range around the marked sequence (profilers filter on it)."""


class Marker:
    """One tiny kernel with a stable, distinctive name."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.flag.bitwise_not_()


def launch_marked(fn: Callable[[], object], iterations: int, marker: Callable[[], None],
                  flush: Callable[[], None] | None = None) -> None:
    """Launch one block of ``iterations`` calls in the order the parser expects (see module doc)."""
    def mark() -> None:
        if flush is not None:
            flush()
        marker()

    mark()
    for _ in range(iterations):
        mark()
        fn()
    mark()


Kernel = tuple[str, float]
"""(kernel name, duration in ms)."""


def split_marked(kernels: Sequence[Kernel], iterations: Sequence[int], cold: bool) -> list[list[list[Kernel]]]:
    """Cut a trace of ``launch_marked`` into [block][iteration] -> kernels of that iteration."""
    kernels = list(kernels)
    need = 2 if cold else 1
    if len(kernels) < need:
        raise ValueError(f"profiler trace has {len(kernels)} kernels; expected the marked sequence")
    flush_name = kernels[0][0] if cold else None
    marker_name = kernels[need - 1][0]
    segments: list[list[Kernel]] = []
    current: list[Kernel] | None = None
    for kernel in kernels:
        if kernel[0] == marker_name:
            if current is not None:
                segments.append(current)
            current = []
        elif current is not None:
            current.append(kernel)
    if current:
        raise ValueError(f"{len(current)} kernels after the terminating marker; the trace is not a marked sequence")
    if cold:
        for seg in segments:
            if not seg or seg[-1][0] != flush_name:
                raise ValueError("a segment does not end with the L2 flush; cannot split iterations reliably")
        segments = [seg[:-1] for seg in segments]
    # Per block: the empty prelude segment, K calls; between blocks one more empty segment
    # (terminator -> next prelude).
    expected = sum(1 + k for k in iterations) + len(iterations) - 1
    if len(segments) != expected:
        raise ValueError(f"found {len(segments)} marked segments, expected {expected}: a kernel may share the "
                         "marker's name or the profiler dropped kernels")
    out, pos = [], 0
    for k in iterations:
        if segments[pos]:
            raise ValueError(f"{len(segments[pos])} unexpected kernels between two blocks or before a first call")
        out.append(segments[pos + 1:pos + 1 + k])
        pos += 2 + k
    return out


def iteration_times_ms(iterations: Sequence[Sequence[Kernel]]) -> list[float]:
    """Sum of device kernel durations of each iteration (ms)."""
    return [float(sum(duration for _, duration in it)) for it in iterations]


def _short(name: str, max_len: int) -> str:
    return name if len(name) <= max_len else name[:max_len - 3] + "..."


def kernel_names(iterations: Sequence[Sequence[Kernel]], max_len: int = 300) -> list[str]:
    """Distinct kernel names in order of first appearance (long template names shortened)."""
    return [_short(n, max_len) for n in dict.fromkeys(name for it in iterations for name, _ in it)]


def kernel_times_ms(iterations: Sequence[Sequence[Kernel]], max_len: int = 300) -> dict[str, float]:
    """Each distinct kernel's median time per call (ms; its launches in one call summed, 0 in a call that
    did not launch it), in order of first appearance: which part of a call is the attention kernel and
    which is preprocessing (a quantization pass, a layout copy)."""
    names = list(dict.fromkeys(name for it in iterations for name, _ in it))
    per_call = [{n: 0.0 for n in names} for _ in iterations]
    for totals, it in zip(per_call, iterations, strict=True):
        for name, duration in it:
            totals[name] += duration
    return {_short(n, max_len): float(statistics.median(t[n] for t in per_call)) for n in names}

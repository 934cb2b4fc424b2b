"""Capturing work into a CUDA graph, with the clean-up a refused capture needs (graph mode and
captured events share it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class GraphCaptureError(RuntimeError):
    """The closure cannot be captured (CPU synchronisation, unsupported op...)."""


def warm_on_side_stream(fns: Sequence[Callable[[], object]], rounds: int, device: torch.device) -> None:
    """Run ``fns`` ``rounds`` times off the default stream: capture needs lazily created handles and
    workspaces to exist already."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(rounds):
            for fn in fns:
                fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)


def capture(work: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """A CUDA graph of what ``work`` launches; GraphCaptureError (with the first line of the cause)
    when the capture is refused."""
    graph = torch.cuda.CUDAGraph()
    gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    rng_before = gen.clone_state() if hasattr(gen, "clone_state") else None
    try:
        with torch.cuda.graph(graph):
            work()
    except Exception as exc:  # capture refused: report why and let the caller fall back
        try:
            torch.cuda.synchronize(device)
        except Exception:
            pass
        # An aborted capture leaves the device's default RNG in capture mode ("Offset increment outside
        # graph capture encountered unexpectedly" on the next random op): give it back a clean state.
        if rng_before is not None:
            try:
                gen.graphsafe_set_state(rng_before)
            except Exception:
                pass
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphCaptureError(f"{type(exc).__name__}: {text}"[:300]) from None
    return graph

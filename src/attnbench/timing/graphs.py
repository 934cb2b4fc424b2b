"""CUDA-graph timing for small kernels: many calls captured in one graph, replayed as one launch.

Launch overhead disappears, which is what makes 10-50 us kernels measurable; the price is that the
L2 cannot be flushed between the calls inside a graph. So the calls rotate over several copies of
the inputs (each prepared by the backend on its own copy): with enough copies every call reads
inputs that were evicted by the calls before it. When memory or the copy cap does not allow enough
copies, the record says the data may have been partly L2-resident (``graph_cold: false``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from attnbench.timing.config import TimingConfig
from attnbench.timing.events import L2Flusher, time_events

MAX_CALLS_PER_GRAPH = 1000


class GraphCaptureError(RuntimeError):
    """The closure cannot be captured (CPU synchronisation, unsupported op...)."""


def copies_for(bytes_per_call: float, l2_bytes: int, *, max_copies: int, copy_bytes: int,
               free_bytes: int | None = None) -> tuple[int, bool]:
    """Input copies to rotate and whether that is enough for cold inputs.

    Between two uses of a copy the other copies move (copies - 1) * bytes_per_call through the cache;
    at least 2x the L2 size evicts it. Extra copies may use at most a quarter of the free memory.
    """
    want = max(2, math.ceil(2 * l2_bytes / max(bytes_per_call, 1.0)) + 1)
    cap = max_copies
    if free_bytes is not None and copy_bytes > 0:
        cap = min(cap, max(1, int(free_bytes // 4 // copy_bytes)))
    n = max(1, min(want, cap))
    return n, n >= want


def tensors(tree):
    """The tensors of a case's inputs (any operator's: dataclasses, tuples, lists, dicts of tensors), in a fixed
    order: two trees of the same structure give theirs at the same places."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif dataclasses.is_dataclass(tree):
        for f in dataclasses.fields(tree):
            yield from tensors(getattr(tree, f.name))
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from tensors(x)


def clone_inputs(inputs):
    """A copy of a case's inputs (any operator's) with fresh storage for every tensor (strides kept)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.clone()
    if dataclasses.is_dataclass(inputs):
        return dataclasses.replace(inputs, **{f.name: clone_inputs(getattr(inputs, f.name))
                                              for f in dataclasses.fields(inputs) if f.init})
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(clone_inputs(x) for x in inputs)
    if isinstance(inputs, dict):
        return {k: clone_inputs(v) for k, v in inputs.items()}
    return inputs


def tensor_bytes(inputs) -> int:
    """Bytes of every tensor in a case's inputs (each storage once)."""
    storages = {(t.untyped_storage().data_ptr(), t.device): t.untyped_storage().nbytes() for t in tensors(inputs)}
    return sum(storages.values())


def _warm_on_side_stream(fns: Sequence[Callable[[], object]], rounds: int, device: torch.device) -> None:
    # Capture needs lazily created handles/workspaces to exist already; warm up off the default stream.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(rounds):
            for fn in fns:
                fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)


def _capture(fns: Sequence[Callable[[], object]], calls: int, device: torch.device) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    rng_before = gen.clone_state() if hasattr(gen, "clone_state") else None
    try:
        with torch.cuda.graph(graph):
            for i in range(calls):
                fns[i % len(fns)]()
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


def time_graph(fns: Sequence[Callable[[], object]], config: TimingConfig,
               device: torch.device) -> tuple[list[float], dict]:
    """Per-call ms from replays of a graph of many calls rotating over ``fns`` (one per input copy).

    Each replay gives one sample (its time / calls in the graph; a replay lasts about
    ``config.graph_target_ms``). ``config``'s sampling policy decides how many replays; the L2 is
    flushed before each replay when ``config.cold_l2``.
    """
    fns = list(fns)
    with torch.cuda.device(device):
        _warm_on_side_stream(fns, max(config.warmup, 2), device)
        probe = TimingConfig(warmup=0, repeat=3, cold_l2=config.cold_l2, min_time_ms=0.0)
        estimate = statistics.median(time_events(fns[0], probe, device))
        calls = min(MAX_CALLS_PER_GRAPH, max(len(fns), math.ceil(config.graph_target_ms / max(estimate, 1e-4))))
        calls = math.ceil(calls / len(fns)) * len(fns)
        graph = _capture(fns, calls, device)
        flush = L2Flusher(device) if config.cold_l2 else None
        graph.replay()  # first replay uploads the graph
        torch.cuda.synchronize(device)
        replay_ms: list[float] = []
        began = time.perf_counter()
        while (count := config.samples_wanted(replay_ms, "cuda", (time.perf_counter() - began) * 1e3)) > 0:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(count)]
            for start, end in events:
                if flush is not None:
                    flush()
                start.record()
                graph.replay()
                end.record()
            torch.cuda.synchronize(device)
            replay_ms += [s.elapsed_time(e) for s, e in events]
        del graph
    return [r / calls for r in replay_ms], {"graph_calls": calls, "graph_copies": len(fns)}

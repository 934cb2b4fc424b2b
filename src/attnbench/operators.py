"""The operators attnbench measures, each declared in one place: softmax attention (``spec.AttnSpec``), a linear
recurrence (``linear.spec.RecurrenceSpec``: Gated DeltaNet, KDA, Mamba2) and index-selected MLA
(``sparse.spec.SparseSpec``: DeepSeek's sparse attention).

A case's spec names its operator (the class attribute ``operator``; a stored spec carries it as the key
``"operator"``, absent for attention so that attention's case ids never changed). The shared pipeline — the
runner, the worker processes, the store, the accuracy checker and the views — asks ``of(spec)`` for what differs
between operators and nothing else:

- ``spec_from_dict``: a stored case back as its spec;
- ``make_inputs``: its seeded inputs on a device (an object with a ``q`` tensor and its ``seed``);
- ``flops`` and ``bytes_moved``: the FLOP and byte conventions (each operator's module states its own), of the
  case's inputs where they matter (the index lists of a sparse case), else of the spec alone; ``info``: what a
  record adds about them (the dense equivalent of a sparse case);
- ``cpu_share``: the share of plain attention math's FLOP rate its CPU kernels reach (a CPU sweep's estimate,
  ``timing.estimate``);
- ``columns``: the store's shape columns (batch, sequence lengths, heads, head sizes, dtype, ...);
- ``memory_guard``: why a case would not fit the device, or None;
- ``expected``: the exact reference and the baseline's error against it (``accuracy.check.Expected``), and
  ``wanted``: the tensors a kernel must return;
- ``reduction``: the longest sum a kernel accumulates over (the verdict's fp32 floor), for every tensor or by
  tensor name (``"*"``: the others); ``layouts``: (token dim, head dim) of each tensor by name, for the block and
  per-head measures (``accuracy.compare``);
- ``check`` (optional): a verdict of its own instead of the tensor comparison (an indexer's selection);
- ``bug_prone``: ``attnbench verify``'s cases, the shapes where the operator's kernel bugs hide, for the settings
  of an asked-for case (attention's are ``cli.verify.bug_prone_specs``).

Backends declare which operator they run (``Backend.operator``); a run's backends are those of its cases'
operator. Operators are imported when a case of theirs is met, so attention alone never imports the others.
"""

from __future__ import annotations

import importlib
from typing import Any

OPERATORS: dict[str, str] = {
    "attention": "attnbench.operators:Attention",
    "recurrence": "attnbench.linear.operator:Recurrence",
    "sparse-mla": "attnbench.sparse.operator:SparseMla",
    "indexer": "attnbench.sparse.indexer_op:Indexer",
}
"""Operator name -> "module:Class" of its declaration."""

_loaded: dict[str, Any] = {}


def get(name: str):
    """The operator called ``name``."""
    if name not in _loaded:
        if name not in OPERATORS:
            raise ValueError(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}")
        module, cls = OPERATORS[name].split(":")
        _loaded[name] = getattr(importlib.import_module(module), cls)()
    return _loaded[name]


def of(spec) -> Any:
    """The operator of a case."""
    return get(getattr(spec, "operator", "attention"))


def spec_from_dict(data: dict):
    """A stored case (``spec.to_dict()``) back as the spec of its operator."""
    data = dict(data)
    return get(data.pop("operator", "attention")).spec_from_dict(data)


def inputs_refusal(specs, device) -> str | None:
    """Why not one of ``specs`` can have its inputs made on ``device`` (its operator's guard, ``memory_guard`` with
    no backend), naming the smallest case; None as soon as one fits, or where free memory is unknown. A sweep
    refused here would only record out-of-memory cases, after allocating for none of them."""
    smallest = None
    for spec in specs:
        op = of(spec)
        reason = op.memory_guard(spec, None, device, inputs_allocated=False)
        if reason is None:
            return None
        size = op.bytes_moved(spec)
        if smallest is None or size < smallest[0]:
            smallest = (size, spec, reason)
    if smallest is None:
        return None
    _, spec, reason = smallest
    what = spec.label() if len(specs) == 1 else f"none of the {len(specs)} cases fits; the smallest, {spec.label()},"
    reason = reason.replace(" (estimated; not run)", "").replace(", ", " for its inputs and outputs, ", 1)
    return f"{what} {reason} (estimated)"


class Attention:
    """Softmax attention: the operator every module of the pipeline was first written for; its pieces stay
    where they are (``spec``, ``inputs``, ``metrics``, ``memory``, ``accuracy``) and are named here."""

    name = "attention"
    flop_note = ("attention's FLOP rates count the attended (query, key) pairs (causal halves them); approximate "
                 "kernels show dense-equivalent rates")
    """What the report says a rate of this operator counts (each operator's own sentence)."""
    cpu_share = 1.0
    """The share of plain attention math's FLOP rate (``timing.estimate``) this operator's CPU kernels reach, of
    its dense FLOPs: the estimate of a CPU sweep's time. Each operator states its own."""

    def spec_from_dict(self, data: dict):
        from attnbench.spec import AttnSpec
        return AttnSpec.from_dict(data)

    def make_inputs(self, spec, device, seed, dist):
        from attnbench.inputs import make_inputs
        return make_inputs(spec, device, seed, dist)

    def flops(self, spec, convention: str = "exact", inputs=None) -> float:
        from attnbench import metrics
        return metrics.flops(spec, convention=convention)

    def bytes_moved(self, spec, inputs=None) -> float:
        from attnbench import metrics
        return metrics.bytes_moved(spec)

    def info(self, spec, inputs) -> dict:
        return {}

    def memory_guard(self, spec, backend, device, *, inputs_allocated: bool = True) -> str | None:
        from attnbench import memory
        return memory.guard(spec, backend, device, inputs_allocated=inputs_allocated)

    def columns(self, spec) -> dict:
        import json
        return dict(
            batch=spec.batch, seq_len=spec.seqlens_q[0] if not spec.is_varlen else max(spec.seqlens_q),
            seq_len_k=spec.seqlens_k[0] if not spec.is_varlen else max(spec.seqlens_k),
            num_seqs=len(spec.seqlens_q), total_q=sum(s for s, _ in spec.sequences),
            heads_q=spec.heads_q, heads_kv=spec.heads_kv, head_dim=spec.head_dim, head_dim_v=spec.head_dim_v,
            emb_dim=spec.heads_q * spec.head_dim, dtype=spec.dtype, causal=int(spec.causal),
            varlen=int(spec.is_varlen), window=json.dumps(spec.window), layout=spec.layout)

    def reduction(self, spec) -> int:
        """A score sums a head's d terms, a softmax row every key, a gradient every query."""
        return max(max(spec.seqlens_q), max(spec.seqlens_k), spec.head_dim, spec.head_dim_v)

    def layouts(self, spec) -> dict:
        from attnbench.accuracy.compare import LAYOUTS
        return LAYOUTS

"""The operators' verdicts at the presets' shapes in bf16 on a GPU: every correct kernel passes, and a kernel wrong
by 1% in one output, one gradient or one head — or wrong about a slot kind, the sink, the LSE's precision, the
initial state or a sequence boundary — fails.

Each case is drawn by the run's own generators (``operators.of(spec).make_inputs``), as ``attnbench run --preset``
draws it; a wrong kernel is a correct one (FlashMLA's sparse kernels, fla's chunk kernels, or the torch chunk form
where no GPU kernel has the pass) with one mistake. With ``ATTNBENCH_MARGINS=FILE`` every verdict's worst ratio to
its limit is appended to FILE as a JSON line (below 1 passes), for the results page.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

from attnbench import operators
from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs
from attnbench.sparse.reference import Selection
from attnbench.sparse.spec import INVALID_RATE, SparseSpec

pytestmark = pytest.mark.gpu
CHECKER = AccuracyChecker(cache_size=1)


def _margin(case: str, kernel: str, acc: dict) -> None:
    path = os.environ.get("ATTNBENCH_MARGINS")
    if path:
        with open(path, "a") as f:
            worst = acc.get("worst") or {}
            f.write(json.dumps({"case": case, "kernel": kernel, "verdict": acc["verdict"],
                                "tensor": worst.get("tensor"), "metric": worst.get("metric"),
                                "ratio": worst.get("ratio"), "reason": (acc.get("reason") or "")[:300]}) + "\n")


def _setup(spec, backend: str):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    b = registry.get(backend)
    if (why := b.supports(spec, "cuda")) is not None:
        pytest.skip(why)
    inputs = operators.of(spec).make_inputs(spec, torch.device("cuda"), 0)
    return b, inputs


def _judge(spec, inputs, outputs: Outputs, backend, case: str, kernel: str) -> dict:
    acc = CHECKER(spec, inputs, outputs, backend)
    _margin(case, kernel, acc)
    return acc


def _expect(spec, inputs, backend, case: str, right: Outputs, wrongs: dict) -> None:
    """The correct outputs pass and every wrong one fails; all verdicts are recorded before any assertion."""
    got = {"correct": _judge(spec, inputs, right, backend, case, f"{backend.name} (correct)")}
    for name, outputs in wrongs.items():
        got[name] = _judge(spec, inputs, outputs, backend, case, f"{backend.name}: {name}")
    bad = [f"correct: {got['correct'].get('reason')}"] if got["correct"]["verdict"] != "pass" else []
    bad += [f"{name} passed (worst {acc['worst']})" for name, acc in got.items()
            if name != "correct" and acc["verdict"] != "fail"]
    assert not bad, bad


def _one_head(t: torch.Tensor, head_dim: int, factor: float = 1.01) -> torch.Tensor:
    t = t.clone()
    t.select(head_dim, 1).copy_((t.select(head_dim, 1).float() * factor).to(t.dtype))
    return t


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    return (t.float() * factor).to(t.dtype)


# ---- sparse MLA ---------------------------------------------------------------------------------------------------
PREFILL = dict(s_q=4096, s_kv=8192, heads=128, topk=2048, invalid=INVALID_RATE)
FRESH = dict(s_q=4096, s_kv=4096, heads=128, topk=2048, invalid=INVALID_RATE)
DECODE = dict(batch=128, s_q=2, s_kv=32768, heads=128, topk=2048, invalid=INVALID_RATE, decode=True)


def _misread(inputs, how: str):
    """The case's inputs with a slot kind misread the way a wrong kernel would: −1 as row 0, or past the cache
    as the last row."""
    sel, rows = inputs.selection, inputs.kv.shape[0]
    if how == "-1 read as row 0":
        idx = torch.where(sel.indices == -1, 0, sel.indices)
    else:
        idx = torch.where(sel.indices >= rows, rows - 1, sel.indices)
    return replace(inputs, selection=Selection(indices=idx, lengths=sel.lengths))


@pytest.mark.parametrize(("name", "fields"), [("V3.2 prefill", PREFILL), ("V3.2 prefill sink", {**PREFILL, "sink": True}),
                                              ("V3.2 fresh prefill", FRESH)], ids=str)
def test_flashmla_sparse_prefill_at_the_presets(name, fields):
    spec = SparseSpec(**fields)
    backend, inputs = _setup(spec, "flashmla-sparse")
    right = backend.prepare(spec, inputs).fn()
    wrongs = {"out 1% off": right.replace(out=_scaled(right.out, 1.01)),
              "out of one head 1% off": right.replace(out=_one_head(right.out, 1)),
              "LSE returned in bf16": right.replace(lse=right.lse.bfloat16()),
              "LSE 2% off": right.replace(lse=right.lse * 1.02)}
    for how in ("-1 read as row 0", "past the cache read"):
        wrongs[how] = backend.prepare(spec, _misread(inputs, how)).fn()
    if spec.sink:
        wrongs["sink rounded to bf16"] = backend.prepare(
            spec, replace(inputs, attn_sink=inputs.attn_sink.bfloat16().float())).fn()
    _expect(spec, inputs, backend, name, right, wrongs)


@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
def test_flashmla_sparse_fp8_decode_at_the_preset(sink):
    spec = SparseSpec(**DECODE, sink=sink)
    backend, inputs = _setup(spec, "flashmla-sparse-fp8")
    right = backend.prepare(spec, inputs).fn()
    wrongs = {"out 1% off": right.replace(out=_scaled(right.out, 1.01)),
              "out of one head 1% off": right.replace(out=_one_head(right.out, 1)),
              "-1 read as row 0": backend.prepare(spec, _misread(inputs, "-1 read as row 0")).fn()}
    if sink:
        wrongs["sink rounded to bf16"] = backend.prepare(
            spec, replace(inputs, attn_sink=inputs.attn_sink.bfloat16().float())).fn()
    _expect(spec, inputs, backend, "V3.2 FP8 decode" + (" sink" if sink else ""), right, wrongs)


def test_sparse_torch_gradients_at_a_v32_shape():
    """No FlashMLA kernel has a backward: the gradients' limits are shown with the torch form, a 1% error in each."""
    spec = SparseSpec(s_q=1024, s_kv=4096, heads=128, topk=2048, invalid=INVALID_RATE, sink=True, pass_="fwd_bwd")
    backend, inputs = _setup(spec, "sparse-torch")
    right = backend.prepare(spec, inputs).fn()
    wrongs = {f"{name} 1% off": right.replace(**{name: _scaled(right.tensors()[name], 1.01)})
              for name in ("dq", "dkv")}
    wrongs["dq of one head 1% off"] = right.replace(dq=_one_head(right.dq, 1))
    _expect(spec, inputs, backend, "V3.2 shape fwd_bwd, 1024 queries", right, wrongs)


# ---- the recurrences ----------------------------------------------------------------------------------------------
RECURRENCES = {
    "Qwen3.5 GDN 4096": dict(kind="gdn", seqlens=(4096,), heads_qk=16, heads_v=64, d_k=128),
    "Qwen3.5 GDN varlen": dict(kind="gdn", seqlens=(1000, 3000, 96), heads_qk=16, heads_v=64, d_k=128),
    "Kimi Linear KDA 2048": dict(kind="kda", seqlens=(2048,), heads_qk=32, d_k=128),
    "Mamba2-2.7B 4096": dict(kind="mamba2", seqlens=(4096,), heads_qk=1, heads_v=80, d_k=128, d_v=64, skip=True),
}


@pytest.mark.parametrize("name", RECURRENCES, ids=str)
def test_recurrence_gradients_at_the_presets(name):
    """fwd_bwd in bf16 from an initial state, as the run draws it: the torch chunk form passes, and 1% in dv, 5% in
    the decay's gradient, 1% in one head of the output fail."""
    spec = RecurrenceSpec(**RECURRENCES[name], dtype="bf16", pass_="fwd_bwd", initial_state=True)
    backend, inputs = _setup(spec, "torch-chunked")
    right = backend.prepare(spec, inputs).fn()
    decay = "ddt" if spec.kind == "mamba2" else "dg"
    wrongs = {"dv 1% off": right.replace(dv=_scaled(right.dv, 1.01)),
              f"{decay} 5% off": right.replace(**{decay: _scaled(right.tensors()[decay], 1.05)}),
              "out of one head 1% off": right.replace(out=_one_head(right.out, -2))}
    _expect(spec, inputs, backend, name + " fwd_bwd", right, wrongs)


@pytest.mark.parametrize("name", RECURRENCES, ids=str)
def test_fla_chunk_forward_at_the_presets(name):
    """fla's chunk kernel, forward from an initial state: it passes; the same kernel handed no state, or its output
    1% off in one head, fails."""
    spec = RecurrenceSpec(**RECURRENCES[name], dtype="bf16", initial_state=True)
    backend, inputs = _setup(spec, "fla-chunk")
    right = backend.prepare(spec, inputs).fn()
    cold = replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
    wrongs = {"initial state ignored": backend.prepare(spec, cold).fn(),
              "out of one head 1% off": right.replace(out=_one_head(right.out, -2))}
    if spec.is_varlen:  # the state carried over each sequence boundary: the packed tokens as one sequence
        whole = spec.replace(seqlens=(spec.total_tokens,))
        packed = replace(inputs, cu_seqlens=None, initial_state=inputs.initial_state[:1],
                         dfinal_state=inputs.dfinal_state[:1])
        wrongs["sequence boundaries ignored"] = right.replace(out=backend.prepare(whole, packed).fn().out)
    _expect(spec, inputs, backend, name + " fwd (fla)", right, wrongs)

"""Recurrence and sparse-MLA cases through the pipeline on the GPU (runner, checker, record): fla's kernels and
FlashMLA's sparse kernels checked and timed, skipped where their packages are not installed."""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.linear.spec import RecurrenceSpec
from attnbench.runner import Runner, RunOptions
from attnbench.sparse.spec import SparseSpec

pytestmark = pytest.mark.gpu


def run_one(spec, backend: str):
    b = registry.get(backend)
    if (why := b.supports(spec, "cuda")) is not None:
        pytest.skip(why)
    records = []
    Runner(RunOptions(device="cuda", backends=(backend,)), run_id="g", env_id=None, sink=records.append,
           checker=AccuracyChecker()).run([spec])
    (record,) = records
    return record


RECURRENCES = [
    ("fla-chunk", dict(kind="gdn", batch=2, seqlens=(1000,))),
    ("fla-chunk", dict(kind="gdn", seqlens=(300, 77, 513), initial_state=True)),
    ("fla-chunk", dict(kind="kda", batch=2, seqlens=(1000,))),
    ("fla-chunk", dict(kind="mamba2", skip=True, batch=2, seqlens=(1000,))),
    ("fla-recurrent", dict(kind="gdn", decode=True, batch=64)),
    ("fla-recurrent", dict(kind="kda", decode=True, batch=64)),
    ("fla-chunk", dict(kind="gdn", batch=2, seqlens=(1000,), pass_="fwd_bwd")),
    ("torch-chunked", dict(kind="gdn", batch=2, seqlens=(1000,), pass_="fwd_bwd")),
]


@pytest.mark.parametrize(("backend", "fields"), RECURRENCES,
                         ids=[f"{b}-{RecurrenceSpec(**f).label()}-{f.get('pass_', 'fwd')}" for b, f in RECURRENCES])
def test_recurrence_kernels_pass_in_the_pipeline(backend, fields):
    spec = RecurrenceSpec(heads_qk=4, heads_v=8, d_k=128, d_v=128, **fields)
    record = run_one(spec, backend)
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", (record.reason, record.accuracy)
    assert record.median_ms > 0 and record.tflops > 0


SPARSE = [
    ("flashmla-sparse", dict(s_q=512, s_kv=2048, heads=64, topk=512, indices="indexer")),
    ("flashmla-sparse", dict(s_q=300, s_kv=1000, heads=128, topk=256, indices="random", sink=True, topk_length=True)),
    ("flashmla-sparse-fp8", dict(batch=8, s_q=2, s_kv=4096, heads=64, topk=512, indices="random", decode=True)),
    ("flashmla-sparse-fp8", dict(batch=4, s_q=1, s_kv=2048, heads=128, topk=1024, indices="window", decode=True,
                                 sink=True)),
    ("sparse-torch", dict(s_q=128, s_kv=1024, heads=64, topk=256, indices="indexer", pass_="fwd_bwd", sink=True)),
]


@pytest.mark.parametrize(("backend", "fields"), SPARSE, ids=[f"{b}-{SparseSpec(**f).label()}" for b, f in SPARSE])
def test_sparse_kernels_pass_in_the_pipeline(backend, fields):
    record = run_one(SparseSpec(**fields), backend)
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", (record.reason, record.accuracy)
    assert record.info["valid_slots"] > 0 and record.info["dense_flops"] > record.flops * 0.5


def test_flashmla_refuses_what_it_lacks_in_one_line():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    b = registry.get("flashmla-sparse-fp8")
    why = b.supports(SparseSpec(batch=2, s_q=1, s_kv=2048, heads=64, topk=512, decode=True, extra=(512, 64)), "cuda")
    assert why is not None and "\n" not in why


@pytest.mark.parametrize(("backend", "s_q", "s_kv"), [("indexer-torch", 1024, 4096), ("indexer-fla", 2048, 2048)])
def test_indexers_select_the_top_keys_in_the_pipeline(backend, s_q, s_kv):
    from attnbench.sparse.indexer_op import IndexerSpec
    record = run_one(IndexerSpec(s_q=s_q, s_kv=s_kv, topk=512), backend)
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", (record.reason, record.accuracy)


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_flex_over_the_index_set_is_right_eagerly_and_refused_compiled(pass_):
    """The mask of the selected slots is right on the GPU (eager flex, scores materialised); compiled, inductor finds
    no Triton config for rows of 576 (torch 2.11, Hopper): recorded as unsupported, not as an error."""
    spec = SparseSpec(batch=2, s_q=64, s_kv=512, heads=16, topk=128, indices="random", sink=True, pass_=pass_)
    records = []
    Runner(RunOptions(device="cuda", backends=("flex-sparse-mla",),
                      backend_options={"flex-sparse-mla": {"compile": False}}), run_id="g", env_id=None,
           sink=records.append, checker=AccuracyChecker()).run([spec])
    (eager,) = records
    assert eager.status == "ok" and eager.accuracy["verdict"] == "pass", (eager.reason, eager.accuracy)
    compiled = run_one(spec, "flex-sparse-mla")
    assert (compiled.status == "ok" and compiled.accuracy["verdict"] == "pass") or (
        compiled.status == "unsupported" and "no Triton config" in compiled.reason), compiled.reason

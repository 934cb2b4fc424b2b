"""Cases of other operators than attention (a recurrence, index-selected MLA) run through the one pipeline: the
runner, the checker, the store, the summary and the exports; wrong kernels fail there as they fail alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from linear_helpers import written_out

from attnbench import operators
from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends.base import Prepared
from attnbench.linear.backends import TorchRecurrent
from attnbench.linear.spec import RecurrenceSpec
from attnbench.metrics import PASS_FLOP_FACTOR
from attnbench.outputs import Outputs
from attnbench.results.record import Record
from attnbench.runner import Runner, RunOptions
from attnbench.sparse.backends import SparseTorch
from attnbench.sparse.reference import Selection, reference_sparse
from attnbench.sparse.spec import SparseSpec
from attnbench.spec import AttnSpec

GDN = RecurrenceSpec(kind="gdn", seqlens=(40,), heads_qk=2, heads_v=4, d_k=16, d_v=12, pass_="fwd_bwd", chunk=16)
# the first queries see fewer keys than top-k (empty slots), lengths cut others, the extra cache and the sink weigh in
SPARSE = SparseSpec(batch=2, s_q=30, s_kv=60, heads=3, topk=48, indices="random", sink=True, topk_length=True,
                    extra=(20, 5), pass_="fwd_bwd")


def run(specs, backends) -> list[Record]:
    records: list[Record] = []
    runner = Runner(RunOptions(device="cpu", backends=tuple(backends)), run_id="r", env_id=None, sink=records.append,
                    checker=AccuracyChecker())
    runner.run(specs)
    return records


def test_a_stored_case_comes_back_as_the_spec_of_its_operator():
    for spec in (GDN, SPARSE, AttnSpec(batch=1, seqlens_q=(8,), heads_q=2, head_dim=8)):
        data = json.loads(json.dumps(spec.to_dict()))
        assert operators.spec_from_dict(data) == spec
        assert operators.of(spec).name == getattr(spec, "operator", "attention")
    assert "operator" not in AttnSpec(batch=1, seqlens_q=(8,), heads_q=2, head_dim=8).to_dict()  # old ids unchanged


def test_recurrence_cases_are_measured_checked_and_stored_like_attention():
    records = run([GDN, GDN.replace(pass_="fwd")], ["torch-recurrent", "torch-chunked", "naive"])
    by = {(r.backend, r.spec.pass_): r for r in records}
    for backend in ("torch-recurrent", "torch-chunked"):
        for pass_ in ("fwd", "fwd_bwd"):
            r = by[backend, pass_]
            assert r.status == "ok" and r.accuracy["verdict"] == "pass", (backend, pass_, r.reason)
            assert r.tflops > 0 and r.info["flops_form"] == "chunked"
    assert set(by["torch-chunked", "fwd_bwd"].accuracy["tensors"]) >= {"out", "final_state", "dq", "dg", "dbeta"}
    assert by["naive", "fwd"].status == "unsupported" and "not recurrence" in by["naive", "fwd"].reason
    back = Record.from_row(by["torch-chunked", "fwd"].to_row())
    assert back.spec == GDN.replace(pass_="fwd") and back.case_id == by["torch-chunked", "fwd"].case_id


@pytest.mark.parametrize("mistake", ["gate-after", "no-beta", "chunk-reset", "wrong-head"])
def test_a_wrong_recurrence_kernel_is_a_mismatch_in_the_pipeline(plugin, mistake):
    class Wrong(TorchRecurrent):
        name = "wrong"

        def prepare(self, spec, inputs):
            def call():
                got = written_out(spec, inputs, mistake=mistake, dtype=torch.float32)
                return Outputs(**{k: v.to(inputs.q.dtype) if k == "out" else v for k, v in got.tensors().items()})
            return Prepared(fn=call)
    plugin("wrong", Wrong)
    (record,) = run([GDN.replace(seqlens=(33,), pass_="fwd")], ["wrong"])
    assert record.status == "mismatch" and record.accuracy["verdict"] == "fail", record.accuracy.get("worst")


def test_a_recurrence_kernel_that_drops_the_final_state_fails(plugin):
    class NoState(TorchRecurrent):
        name = "no-state"

        def prepare(self, spec, inputs):
            inner = super().prepare(spec, inputs).fn
            return Prepared(fn=lambda: inner().replace(final_state=None))
    plugin("no-state", NoState)
    (record,) = run([GDN.replace(pass_="fwd")], ["no-state"])
    assert record.status == "mismatch" and "final_state: not returned" in record.reason


def test_sparse_cases_count_the_selected_slots_and_pass_the_plain_form():
    (fwd, both) = run([SPARSE.replace(pass_="fwd"), SPARSE], ["sparse-torch"])
    for r in (fwd, both):
        assert r.status == "ok" and r.accuracy["verdict"] == "pass", r.reason
        assert 0 < r.info["valid_slots"] < SPARSE.queries * (SPARSE.topk + 5)  # lengths cut slots
        assert r.info["dense_flops"] > 0
    assert set(both.accuracy["tensors"]) >= {"out", "lse", "dq", "dkv", "dextra_kv", "dattn_sink"}
    assert both.flops == pytest.approx(PASS_FLOP_FACTOR["fwd_bwd"] * fwd.flops)  # attention's convention


MISTAKES = {
    "index off by one": lambda sel, kw: (Selection(indices=torch.where(sel.indices >= 0, sel.indices + 1, sel.indices),
                                                   lengths=sel.lengths), kw),
    "-1 read as token 0": lambda sel, kw: (Selection(indices=sel.indices.clamp(min=0), lengths=sel.lengths), kw),
    "lengths ignored": lambda sel, kw: (Selection(indices=sel.indices), kw),
    "extra cache dropped": lambda sel, kw: (sel, dict(kw, extra_kv=None, extra=None)),
    "sink ignored": lambda sel, kw: (sel, dict(kw, attn_sink=None)),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_wrong_sparse_kernel_is_a_mismatch_in_the_pipeline(plugin, mistake):
    class Wrong(SparseTorch):
        name = "wrong-sparse"

        def prepare(self, spec, inputs):
            sel, kw = MISTAKES[mistake](inputs.selection, inputs.kwargs(spec))

            def call():
                got = reference_sparse(inputs.q, inputs.kv, sel, dtype=torch.float32, **kw)
                return Outputs(out=got.out.to(inputs.q.dtype), lse=got.lse)
            return Prepared(fn=call)
    plugin("wrong-sparse", Wrong)
    (record,) = run([SPARSE.replace(pass_="fwd")], ["wrong-sparse"])
    assert record.status == "mismatch", (mistake, record.accuracy.get("worst"))


def test_a_correct_fp32_sparse_kernel_passes(plugin):
    class Right(SparseTorch):
        name = "right-sparse"

        def prepare(self, spec, inputs):
            def call():
                got = reference_sparse(inputs.q, inputs.kv, inputs.selection, dtype=torch.float32,
                                       **inputs.kwargs(spec))
                return Outputs(out=got.out.to(inputs.q.dtype), lse=got.lse)
            return Prepared(fn=call)
    plugin("right-sparse", Right)
    (record,) = run([SPARSE.replace(pass_="fwd")], ["right-sparse"])
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", record.reason


def test_decode_cases_read_the_fp8_rows_the_reference_dequantizes():
    spec = SparseSpec(batch=2, s_q=2, s_kv=300, heads=4, topk=64, indices="random", decode=True)
    inputs = operators.of(spec).make_inputs(spec, "cpu", 0)
    assert inputs.rows.shape == (600, 656) and inputs.rows.dtype == torch.uint8
    from attnbench.sparse.fp8 import dequantize_rows
    assert torch.equal(inputs.kv, dequantize_rows(inputs.rows))
    # each request's slots name rows of its own block of the stacked cache
    first, second = inputs.selection.indices[:2], inputs.selection.indices[2:]
    assert first.max() < 300 and second[second >= 0].min() >= 300
    (record,) = run([spec], ["sparse-torch", "flashmla-sparse-fp8"])[:1]
    assert record.status == "ok" and record.accuracy["verdict"] == "pass"


# ---- the command line ---------------------------------------------------------------------------------------
SRC = str(Path(__file__).resolve().parents[2] / "src")


def attnbench(*args, cwd):
    """The checkout under test, whatever attnbench is installed, at 100 columns."""
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_run_op_gdn_on_the_cpu_stores_checked_records(tmp_path):
    got = attnbench("run", "--op", "gdn", "--seq-lens", "48", "--q-heads", "2", "--v-heads", "4", "--head-size", "16",
                    "--pass", "fwd", "fwd_bwd", "--db", "r.db", "--output", "r.json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "torch" in got.stdout and "4/4 cases ok" in got.stdout
    rows = json.loads((tmp_path / "r.json").read_text())
    assert {(r["backend"], r["pass"], r["verdict"], r["operator"]) for r in rows} == {
        (b, p, "pass", "recurrence") for b in ("torch-recurrent", "torch-chunked") for p in ("fwd", "fwd_bwd")}
    shown = attnbench("show", "--table", "--db", "r.db", cwd=tmp_path)
    assert shown.returncode == 0 and "gdn b1 s48 h2/4" in shown.stdout


def test_qk_prenormed_hands_the_op_normalised_q_and_k(tmp_path):
    got = attnbench("run", "--op", "kda", "--qk-prenormed", "--seq-lens", "40", "--q-heads", "2", "--head-size", "16",
                    "--pass", "fwd_bwd", "--db", "r.db", "--output", "r.json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    assert {r["verdict"] for r in rows} == {"pass"} and all(" l2" not in r["label"] for r in rows), rows
    from attnbench.linear.inputs import make_inputs
    from attnbench.linear.spec import RecurrenceSpec
    spec = RecurrenceSpec(kind="kda", seqlens=(40,), heads_qk=2, d_k=16, l2norm=False)
    norms = make_inputs(spec).k.float().norm(dim=-1)  # the op's inputs are unit vectors already
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)


def test_decay_bound_draws_kdas_bounded_decay(tmp_path):
    # --decay-bound LB: the log-decays are LB·sigmoid(exp(A_log)·(a + dt_bias)), inside [LB, 0), where the default
    # (unbounded) gate of the same seed goes far below; the case says so and passes the check forward and backward
    got = attnbench("run", "--op", "kda", "--decay-bound", "-5", "--seq-lens", "40", "--q-heads", "2", "--head-size",
                    "16", "--pass", "fwd", "fwd_bwd", "--db", "r.db", "--output", "r.json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    assert {r["verdict"] for r in rows} == {"pass"} and all(r["label"].endswith(" lb-5") for r in rows), rows
    from attnbench.linear.inputs import make_inputs
    from attnbench.linear.spec import RecurrenceSpec
    spec = RecurrenceSpec(kind="kda", seqlens=(4096,), heads_qk=4, d_k=16, decay_bound=-5)
    x = make_inputs(spec)
    want = -5 * torch.sigmoid(x.A_log.exp().view(4, 1) * (x.a + x.dt_bias.view(4, 16)))
    assert torch.allclose(x.g, want.float()) and x.g.min() >= -5 and x.g.max() <= 0
    assert -3.0 < x.g.mean() < -2.0  # centred: mean log-decay LB / 2
    assert make_inputs(spec.replace(decay_bound=None)).g.min() < -10  # what the bound cuts off


@pytest.mark.parametrize(("args", "needle"), [
    (["--op", "gdn", "--kv-heads", "2"], "--kv-heads shapes attention cases"),
    (["--op", "gdn", "--q-heads", "2", "--v-heads", "3"], "must be a multiple of q/k heads"),
    (["--op", "gdn", "--decode", "--seq-lens", "8"], "drop --seq-lens"),
    (["--op", "gdn", "--topk", "8"], "--topk belongs to another --op"),
    (["--chunk", "32"], "--chunk belongs to another --op than attention"),
    (["--v-heads", "4", "--qk-prenormed"], "--v-heads, --qk-prenormed belong to another --op than attention"),
    (["--op", "mamba2", "--qk-prenormed"], "--qk-prenormed is for gdn and kda: mamba2 never L2-normalises"),
    (["--op", "gdn", "--decay-bound", "-5"], "--decay-bound is kda's bounded decay: gdn has none"),
    (["--op", "kda", "--decay-bound", "3"], "bad --decay-bound '3'"),
    (["--decay-bound", "-5"], "--decay-bound belongs to another --op than attention"),
    (["--op", "sparse-mla", "--seq-lens", "64", "--kv-seq-lens", "32"], "more than its 32 cache rows"),
    (["--op", "sparse-mla", "--topk", "9000", "--kv-seq-lens", "8192"], "top-k 9000 is more than"),
    (["--op", "sparse-mla", "--extra-cache", "12"], "give ROWSxTOPK"),
    (["--op", "mamba3"], "bad --op 'mamba3'"),
])
def test_bad_operator_input_is_one_line_exit_2(tmp_path, args, needle):
    got = attnbench("run", *args, "--db", "r.db", cwd=tmp_path)
    assert got.returncode == 2 and needle in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.db").exists()


# ---- the lightning indexer ------------------------------------------------------------------------------------
INDEXER = dict(s_q=48, s_kv=200, heads=4, dim=32, topk=24)


def _indexer_kernel(mistake):
    from attnbench.sparse.indexer import _top
    from attnbench.sparse.indexer_op import IndexerTorch

    class Wrong(IndexerTorch):
        name = "wrong-indexer"

        def prepare(self, spec, inputs):
            t = inputs.inputs

            def call():
                q, k = t.q.float(), t.k.float() * t.k_scale[:, None]
                prod = torch.einsum("thd,sd->ths", q, k)
                prod = prod if mistake == "no relu" else prod.relu()
                w = torch.ones_like(t.weights) if mistake == "weights ignored" else t.weights
                logits = torch.einsum("ths,th->ts", prod, w)
                seen = t.visible()
                if mistake == "one future key":
                    seen = seen | torch.nn.functional.pad(seen, (1, 0))[:, :-1]
                logits = logits.masked_fill(~seen, -float("inf"))
                idx = _top(logits, spec.topk)[0]
                if mistake == "index off by one":
                    idx = torch.where(idx >= 0, idx + 1, idx)
                return Outputs(indices=idx)
            return Prepared(fn=call)
    return Wrong


def test_the_indexer_selection_of_the_plain_form_passes():
    from attnbench.sparse.indexer_op import IndexerSpec
    (record,) = run([IndexerSpec(**INDEXER)], ["indexer-torch"])
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", record.reason
    assert record.accuracy["selection"]["expected"] > 0 and "logits" in record.accuracy["tensors"]


@pytest.mark.parametrize("mistake", ["no relu", "weights ignored", "one future key", "index off by one"])
def test_a_wrong_indexer_fails_its_selection_check(plugin, mistake):
    from attnbench.sparse.indexer_op import IndexerSpec
    plugin("wrong-indexer", _indexer_kernel(mistake))
    (record,) = run([IndexerSpec(**INDEXER)], ["wrong-indexer"])
    assert record.status == "mismatch" and record.reason.startswith("selection:"), (mistake, record.reason)


def test_a_right_indexer_without_logits_passes(plugin):
    from attnbench.sparse.indexer_op import IndexerSpec
    plugin("right-indexer", _indexer_kernel(None))
    (record,) = run([IndexerSpec(**INDEXER)], ["right-indexer"])
    assert record.status == "ok" and record.accuracy["verdict"] == "pass"


def test_flex_over_the_index_set_passes_the_forward_check():
    """FlexAttention with a mask of the selected slots (eager on the CPU): the main and extra caches, lengths, the
    sink, queries of two requests; no repeated rows in the drawn index lists."""
    (record,) = run([SPARSE.replace(pass_="fwd")], ["flex-sparse-mla"])
    assert record.status == "ok" and record.accuracy["verdict"] == "pass", record.reason


def test_a_recurrence_runs_report_says_its_own_flop_count_and_draws_a_line_per_backend(tmp_path):
    # A decode sweep over the batch: the report's note is the recurrence's FLOP convention (not attention's attended
    # pairs), each backend is one line over the batch sizes (not a line per batch), and no panel says "causal".
    got = attnbench("run", "--op", "gdn", "--decode", "--batch-size", "1", "4", "--q-heads", "2", "--head-size", "16",
                    "--db", "r.db", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    report = attnbench("report", "--db", "r.db", "-o", "r.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert "a recurrence&#x27;s count the chunked form" in page or "a recurrence's count the chunked form" in page
    assert "attended (query, key) pairs" not in page
    from attnbench.report import plots
    from attnbench.results.store import ResultStore
    rows = ResultStore(tmp_path / "r.db").rows()
    fig = plots.figure(rows, "num_seqs", "ms")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["fwd"] and panels[0].get_xlabel() == "sequences (batch)"
    labels = sorted(line.get_label().split(" [")[0]  # a mark of a busy CPU's times aside
                    for line in panels[0].get_lines() if not line.get_label().startswith("_"))
    assert labels == ["torch-chunked", "torch-recurrent"], labels
    assert all(len(line.get_xdata()) == 2 for line in panels[0].get_lines() if not line.get_label().startswith("_"))

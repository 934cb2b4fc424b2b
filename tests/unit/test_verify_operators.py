"""`attnbench verify --op X` (and ``attnbench.verify(op=...)``) checks each operator's bug-prone shapes through the
operator's own inputs and check: the correct PyTorch kernels pass, and kernels wrong in a way only those shapes
show fail, with exit status 1."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from linear_helpers import written_out

from attnbench import operators
from attnbench.backends.base import Capabilities, Prepared
from attnbench.cli import main
from attnbench.linear.backends import TorchRecurrent
from attnbench.linear.spec import RecurrenceSpec
from attnbench.outputs import Outputs
from attnbench.sparse.backends import SparseTorch
from attnbench.sparse.reference import Selection, reference_sparse
from attnbench.sparse.spec import SparseSpec


def verify(tmp_path, capsys, *args) -> tuple[int, list[dict]]:
    """Exit status and the JSON rows of ``attnbench verify --device cpu ARGS``."""
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--db", str(tmp_path / "v.db"), "--json", *args])
    return exc.value.code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("op", "backends"), [
    ("gdn", {"torch-recurrent", "torch-chunked"}), ("kda", {"torch-recurrent", "torch-chunked"}),
    ("mamba2", {"torch-recurrent", "torch-chunked"}), ("sparse-mla", {"sparse-torch", "flex-sparse-mla"}),
    ("indexer", {"indexer-torch"})])
def test_verify_op_checks_its_bug_prone_shapes_and_the_torch_kernels_pass(tmp_path, capsys, op, backends):
    code, rows = verify(tmp_path, capsys, "--op", op)
    assert code == 0, [(r["backend"], r["case"], r["reason"]) for r in rows if r["status"] != "ok"]
    checked = {r["backend"] for r in rows if r["accuracy"] is not None}
    assert checked >= backends and all(r["accuracy"]["verdict"] == "pass" for r in rows if r["accuracy"])
    assert len({r["case"] for r in rows}) >= 2


def test_the_recurrence_cases_reach_every_state_path():
    asked = RecurrenceSpec(kind="gdn", pass_="fwd_bwd")
    cases = operators.of(asked).bug_prone(asked, frozenset(), "cpu")
    assert all(c.pass_ == "fwd_bwd" for c in cases)
    varlen = [c for c in cases if c.is_varlen]
    assert varlen and all(c.initial_state and c.heads_v == 2 * c.heads_qk and 1 in c.seqlens for c in varlen)
    assert any(not c.initial_state for c in cases)  # a zero state too
    assert any(c.decode for c in cases)
    assert all(c.decode or any(n > c.chunk and n % c.chunk for n in c.seqlens) for c in cases)  # a partial chunk


def test_the_sparse_cases_have_empty_slots_lengths_a_sink_an_extra_cache_and_fp8_rows():
    asked = SparseSpec(pass_="fwd_bwd")
    cases = operators.of(asked).bug_prone(asked, frozenset(), "cpu")
    prefill = next(c for c in cases if c.s_q == c.s_kv)
    inputs = operators.of(prefill).make_inputs(prefill, "cpu", 0)
    assert (inputs.selection.indices == -1).any()  # the first queries see fewer keys than top-k
    assert any(c.topk_length for c in cases) and any(c.sink for c in cases) and any(c.extra for c in cases)
    assert any(c.decode for c in cases)
    assert not any(c.decode for c in operators.of(asked).bug_prone(asked.replace(dtype="fp32"), frozenset(), "cpu"))


def test_the_api_verifies_an_operator_and_a_preset_at_its_heads(tmp_path):
    import attnbench
    records = attnbench.verify(op="gdn", device="cpu", db=str(tmp_path / "a.db"), backends="torch-chunked")
    assert records and all(r.status == "ok" and r.accuracy["verdict"] == "pass" for r in records)
    # a preset's heads over verify's lengths (its head size given smaller, to stay fast)
    records = attnbench.verify(preset="kimi-linear-kda", head_size=16, device="cpu", db=str(tmp_path / "a.db"),
                               backends="torch-chunked")
    assert {(r.spec.kind, r.spec.heads_qk, r.spec.d_k) for r in records} == {("kda", 32, 16)}
    assert any(r.spec.is_varlen for r in records) and all(r.status == "ok" for r in records)


def test_given_lengths_are_checked_as_asked(tmp_path, capsys):
    code, rows = verify(tmp_path, capsys, "--op", "gdn", "--seq-lens", "21", "--q-heads", "2", "--head-size", "8",
                        "--backends", "torch-chunked")
    assert code == 0 and [r["case"] for r in rows] == ["gdn b1 s21 h2 k8 v8 bf16 h0 l2"]
    assert rows[0]["pass"] == "fwd_bwd"


@pytest.mark.parametrize(("args", "needle"), [
    (["--op", "gdn", "--causal"], "--causal shapes attention cases"),
    (["--op", "indexer", "--sink"], "--sink belongs to another --op than indexer"),
    (["--op", "mamba3"], "bad --op 'mamba3'")])
def test_bad_operator_input_is_one_line_exit_2(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--db", str(tmp_path / "v.db"), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "v.db").exists()


# ---- kernels wrong in a way only verify's shapes show --------------------------------------------------------
def _wrong_recurrence(mistake):
    class Wrong(TorchRecurrent):
        name = "wrong-recurrence"

        def prepare(self, spec, inputs):
            if mistake == "initial state ignored" and spec.initial_state:
                inputs = dataclasses.replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
            return Prepared(fn=lambda: written_out(spec, inputs, mistake=None if mistake == "initial state ignored"
                                                   else mistake, dtype=torch.float32))
    return Wrong


WRONG_WHERE = {"wrong-head": lambda case: " h2/4 " in case, "initial state ignored": lambda case: " h0" in case
               or " decode" in case, "chunk-reset": lambda case: " decode" not in case}
"""The cases each mistake shows in (the rest pass: the kernel is right there)."""


@pytest.mark.parametrize("mistake", list(WRONG_WHERE))
def test_a_wrong_recurrence_kernel_fails_verify(tmp_path, capsys, plugin, mistake):
    # value head hv reading q/k head hv % H, the state handed in ignored, the state dropped at each chunk's end:
    # run's default cases (as many value heads as q/k heads, a zero state) show none of the first two
    plugin("wrong-recurrence", _wrong_recurrence(mistake))
    code, rows = verify(tmp_path, capsys, "--op", "gdn", "--dtype", "fp32", "--backends", "wrong-recurrence")
    assert code == 1
    assert {r["case"]: r["status"] == "mismatch" for r in rows} == {
        r["case"]: WRONG_WHERE[mistake](r["case"]) for r in rows}, [(r["case"], r["status"]) for r in rows]


class _WrongSparse(SparseTorch):
    """Reads an empty (−1) slot as row 0 of its request's cache: invisible unless a query sees fewer keys than
    top-k."""
    name = "wrong-sparse"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), backward=False)

    def prepare(self, spec, inputs):
        sel = inputs.selection
        row0 = (torch.arange(sel.indices.shape[0]) // spec.s_q * spec.s_kv).to(torch.int32)[:, None]
        wrong = Selection(indices=torch.where(sel.indices < 0, row0, sel.indices), lengths=sel.lengths)

        def call():
            got = reference_sparse(inputs.q, inputs.kv, wrong, dtype=torch.float32, **inputs.kwargs(spec))
            return Outputs(out=got.out.to(inputs.q.dtype), lse=got.lse)
        return Prepared(fn=call)


def test_a_sparse_kernel_that_reads_empty_slots_fails_verify_in_every_case(tmp_path, capsys, plugin):
    """Every case draws empty slots anywhere in its lists, and the causal prefill's first queries have -1 at their
    ends: a kernel that reads -1 as row 0 fails them all; with no slot emptied it fails the causal prefill alone."""
    plugin("wrong-sparse", _WrongSparse)
    code, rows = verify(tmp_path, capsys, "--op", "sparse-mla", "--backends", "wrong-sparse")
    assert code == 1
    checked = {r["case"] for r in rows if r["status"] in ("ok", "mismatch")}
    failed = {r["case"] for r in rows if r["status"] == "mismatch"}
    assert checked and failed == checked, checked - failed
    code, rows = verify(tmp_path, capsys, "--op", "sparse-mla", "--backends", "wrong-sparse", "--empty-slots", "0")
    failed = {r["case"] for r in rows if r["status"] == "mismatch"}
    assert code == 1 and failed and all(" q77 kv77 " in case for case in failed), failed  # s_q = s_kv: the -1 slots
    assert any(r["status"] == "ok" for r in rows)  # cases without empty slots pass: the rest is right


def _padding_indexer():
    from attnbench.sparse.indexer import _top
    from attnbench.sparse.indexer_op import IndexerTorch

    class Padding(IndexerTorch):
        """Fills a query's slots past its visible keys with keys it cannot see (a finite mask value)."""
        name = "padding-indexer"

        def prepare(self, spec, inputs):
            t = inputs.inputs

            def call():
                prod = torch.einsum("thd,sd->ths", t.q.float(), t.k.float() * t.k_scale[:, None]).relu()
                logits = torch.einsum("ths,th->ts", prod, t.weights).masked_fill(~t.visible(), -1e30)
                return Outputs(indices=_top(logits, spec.topk)[0])
            return Prepared(fn=call)
    return Padding


def test_an_indexer_that_pads_with_unseen_keys_fails_verify(tmp_path, capsys, plugin):
    plugin("padding-indexer", _padding_indexer())
    code, rows = verify(tmp_path, capsys, "--op", "indexer", "--backends", "padding-indexer")
    assert code == 1
    failed = [r for r in rows if r["status"] == "mismatch"]
    assert failed and all("unseen" in r["reason"] for r in failed), rows


def test_the_grid_names_the_operators_cases_within_100_columns(tmp_path, capsys, plugin):
    plugin("wrong-sparse", _WrongSparse)
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--db", str(tmp_path / "v.db"), "--op", "sparse-mla", "--backends",
              "sparse-torch,wrong-sparse"])
    out = capsys.readouterr().out
    assert exc.value.code == 1
    grid = out[out.index("sparse-mla h4 d576/512 bf16: worst error / limit"):]
    assert max(map(len, grid.splitlines())) <= 100
    for words in ("top-k 32 indexer", "lengths", "sink", "extra 40x12", "fp8 decode"):
        assert words in " ".join(grid.split()), words
    assert "✗" in grid and "failed its check" in grid


def test_no_initial_state_reaches_every_prefill_case_and_no_decode_case():
    from attnbench import operators
    from attnbench.linear.spec import RecurrenceSpec
    asked = RecurrenceSpec(kind="gdn", heads_qk=2, d_k=16, initial_state=False)
    cases = operators.get("recurrence").bug_prone(asked, frozenset({"initial_state"}), "cpu")
    assert [c.initial_state for c in cases if not c.decode] == [False, False]
    assert all(c.initial_state for c in cases if c.decode)

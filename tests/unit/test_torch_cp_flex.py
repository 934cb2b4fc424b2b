"""torch-cp-flex without a GPU: its document mask, the rows torch gives each rank, its refusals and its plumbing.

The FlexAttention kernel and the collectives need CUDA (the peer refuses a CPU); everything around them is
checked here with the real torch names it uses (private, read at torch 2.11 and unchanged in the installed
torch): the mask against ``documents.py``'s exact per-document result, the balancers' rows against torch's own
rewrite of the mask for a rank (``_create_cp_block_mask``, run eagerly on the CPU), the one-line refusals, and
the check's rule that a peer's own single-device kernel cannot widen its bound by ignoring the documents.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from attnbench.cli.common import UserError
from attnbench.distributed import bench, documents, peers
from attnbench.distributed import layout as lay
from attnbench.distributed import torch_cp_flex as flex
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec

LENGTHS = (17, 77, 1, 33, 128)  # odd lengths, one of a single token


def _api():
    try:
        return flex.torch_api()
    except peers.PeerUnavailable as exc:  # an older torch: the refusal is tested below
        pytest.skip(str(exc))


def _expected_mask(lengths, causal) -> torch.Tensor:
    """(S, S) bool from the documents' bounds: same document (and key not after query when causal)."""
    total = sum(lengths)
    mask = torch.zeros(total, total, dtype=torch.bool)
    for a, b in documents.Documents(tuple(lengths)).bounds:
        mask[a:b, a:b] = torch.ones(b - a, b - a).tril().bool() if causal else True
    return mask


def _grid(mask_mod, rows, cols) -> torch.Tensor:
    return mask_mod(torch.tensor(0), torch.tensor(0), rows[:, None], cols[None, :])


def _masked_attention(q, k, v, mask, scale):
    """bshd attention of q's rows against k's under ``mask`` (rows x keys); rows with no key give zeros."""
    groups = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(groups, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("causal", [True, False])
def test_document_mask_is_the_documents_mask(causal):
    pos = torch.arange(sum(LENGTHS))
    got = _grid(flex.document_mask_mod(LENGTHS, causal), pos, pos)
    assert torch.equal(got, _expected_mask(LENGTHS, causal))
    assert flex.document_ids(LENGTHS).tolist() == [i for i, n in enumerate(LENGTHS) for _ in range(n)]


@pytest.mark.parametrize("causal", [True, False])
def test_attention_under_the_mask_is_documents_exact(causal):
    spec = AttnSpec(seqlens_q=(sum(LENGTHS),), heads_q=4, heads_kv=2, head_dim=16, dtype="fp64", causal=causal)
    x = make_inputs(spec, "cpu", 7)
    pos = torch.arange(sum(LENGTHS))
    mask = _grid(flex.document_mask_mod(LENGTHS, causal), pos, pos)
    out = _masked_attention(x.q, x.k, x.v, mask, spec.softmax_scale)
    exact = documents.exact(x.q, x.k, x.v, x.dout, documents.Documents(LENGTHS), causal=causal,
                            scale=spec.softmax_scale)
    torch.testing.assert_close(out, exact["out"], rtol=1e-10, atol=1e-10)


class _Mesh:
    """The three things ``_create_cp_block_mask`` asks of its DeviceMesh, for one rank of ``world``."""

    def __init__(self, rank, world):
        self.rank, self.world, self.device_type = rank, world, "cpu"

    def size(self):
        return self.world

    def get_local_rank(self):
        return self.rank


@pytest.mark.parametrize("lengths, world, balancer", [
    ((256, 512, 256, 512), 2, "_PerDocumentHeadTailLoadBalancer"),  # every length a multiple of 2 x world
    ((63, 301, 148, 500, 100, 200, 224), 2, "_HeadTailLoadBalancer"),  # not: one head-tail over the sequence
    ((1024,), 4, "_HeadTailLoadBalancer"),
    ((128, 640, 256), 4, "_PerDocumentHeadTailLoadBalancer"),
])
@pytest.mark.parametrize("causal", [True, False])
def test_torchs_rewritten_mask_is_the_mask_at_this_ranks_rows(monkeypatch, lengths, world, balancer, causal):
    """torch builds each rank's block mask for the rows its balancer gives it; the check shards the inputs at
    ``rank_positions``: the two must be the same rows, and K/V gathered in rank order."""
    api = _api()
    from torch.nn.attention.flex_attention import create_block_mask
    attention = importlib.import_module(f"{flex._CP}._attention")
    monkeypatch.setattr(attention, "_compiled_create_block_mask", create_block_mask)  # eager: no compiler
    lb, name, why = flex.load_balancer(api, lengths, world, "cpu")
    assert name == balancer and (why is None) == (name.startswith("_PerDocument") or len(lengths) == 1)
    total = sum(lengths)
    everyone = [flex.rank_positions(lb, r, world) for r in range(world)]
    gathered = torch.cat(everyone)  # K and V as the all-gather lays them out
    assert sorted(gathered.tolist()) == list(range(total)) and all(len(p) == total // world for p in everyone)
    full = _expected_mask(lengths, causal)
    mask_mod = flex.document_mask_mod(lengths, causal)
    for rank in range(world):
        local = api["_create_cp_block_mask"](mask_mod=mask_mod, B=1, H=1, Q_LEN=total, KV_LEN=total,
                                             device_mesh=_Mesh(rank, world), load_balancer=lb)
        want = full[everyone[rank]][:, gathered]
        assert torch.equal(_grid(local.mask_mod, torch.arange(total // world), torch.arange(total)), want)
        blocks = want.reshape(total // world // 128, 128, total // 128, 128).any(3).any(1)
        assert torch.equal(local.to_dense()[0, 0].bool(), blocks)


def test_head_tail_rows_are_the_zigzag_layout_and_balance_one_causal_sequence():
    api = _api()
    lb, _, _ = flex.load_balancer(api, (1536,), 3, "cpu")
    everyone = [flex.rank_positions(lb, r, 3) for r in range(3)]
    assert all(torch.equal(everyone[r], lay.positions(1536, "zigzag", r, 3)) for r in range(3))
    assert len(set(flex.pairs_per_rank((1536,), True, everyone))) == 1


def test_torchs_per_document_balancer_orders_document_by_document():
    """torch 2.11 (and the installed torch) lays out each document's rank chunks one after another and shards
    the result contiguously, so a rank holds whole documents, not a head and a tail of each as its docstring
    draws: the record's ``pairs_per_rank`` shows what that does to the balance. If torch changes this, this
    test fails and ``rank_positions``' docstring is out of date (the check stays right: it reads torch's order)."""
    api = _api()
    lb, name, _ = flex.load_balancer(api, (8, 16, 8), 2, "cpu")
    assert name == "_PerDocumentHeadTailLoadBalancer"
    rank0 = flex.rank_positions(lb, 0, 2).tolist()
    assert set(range(8)) <= set(rank0)  # all of the first document on rank 0
    assert rank0[:8] == [0, 1, 6, 7, 2, 3, 4, 5]  # its chunks for rank 0 (head, tail), then rank 1's


@pytest.mark.parametrize("causal", [True, False])
def test_pairs_per_rank_count_the_document_mask(causal):
    pos = torch.randperm(sum(LENGTHS), generator=torch.Generator().manual_seed(3))
    parts = [pos[:100], pos[100:]]
    got = flex.pairs_per_rank(LENGTHS, causal, parts)
    full = _expected_mask(LENGTHS, causal)
    assert got == [int(full[p].sum()) for p in parts]
    assert sum(got) == sum(n * (n + 1) // 2 if causal else n * n for n in LENGTHS)


# ---- refusals -----------------------------------------------------------------------------------
def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_older_torch_is_refused_naming_the_version():
    with pytest.raises(peers.PeerUnavailable) as exc:
        flex.torch_api("2.10.0+cu128")
    text = _one_line(exc)
    assert "needs torch >= 2.11" in text and "this is torch 2.10.0+cu128" in text


def test_missing_private_names_are_refused_naming_each(monkeypatch):
    names = dict(flex.NAMES)
    names["torch.nn.attention.flex_attention"] = ("flex_attention", "no_such_mask_builder")
    names["torch.distributed.no_such_module"] = ("_Balancer",)
    monkeypatch.setattr(flex, "NAMES", names)
    with pytest.raises(peers.PeerUnavailable) as exc:
        flex.torch_api("2.11.0")
    text = _one_line(exc)
    assert text.startswith("torch 2.11.0 lacks what torch-cp-flex uses")
    assert "torch.nn.attention.flex_attention.no_such_mask_builder" in text
    assert "torch.distributed.no_such_module._Balancer" in text and ".flex_attention.flex_attention" not in text


def test_a_context_parallel_style_without_flex_is_refused(monkeypatch):
    _api()
    attention = importlib.import_module(f"{flex._CP}._attention")
    style = types.SimpleNamespace(AttentionType=types.SimpleNamespace(SDPA="scaled_dot_product_attention"))
    monkeypatch.setattr(attention, "_ContextParallel", style)
    with pytest.raises(peers.PeerUnavailable) as exc:
        flex.torch_api("2.11.0")
    assert _one_line(exc).endswith("_context_parallel._attention._ContextParallel.AttentionType.FLEX")


def test_a_cpu_is_refused_before_any_mesh():
    spec = AttnSpec(seqlens_q=(256, 256), heads_q=4, head_dim=16, dtype="fp32", causal=True)
    with pytest.raises(peers.PeerUnavailable) as exc:
        flex.torch_cp_flex(spec=spec, device=torch.device("cpu"), rank=0, world=2)
    assert _one_line(exc).startswith("torch native context parallel with FlexAttention (torch-cp-flex) runs on "
                                     "CUDA only")


def test_lengths_that_are_not_whole_blocks_per_rank_are_refused_with_the_nearest():
    flex.check_seq_len(512, 2)
    flex.check_seq_len(1024, 8)
    with pytest.raises(ValueError, match=r"^sequence length 384 is not a multiple of 256 \(torch-cp-flex: "
                                         r"FlexAttention's 128-row blocks x world size 2\); lengths are not padded: "
                                         r"use e.g. 256 or 512$"):
        flex.check_seq_len(384, 2)


# ---- plumbing -----------------------------------------------------------------------------------
def _ctx(ranks_per_device=1):
    return bench.DistContext(rank=0, world=2, local_rank=0, device=torch.device("cpu"), backend="gloo",
                             ranks_per_device=ranks_per_device)


def test_it_is_a_method_with_its_own_kernel_that_takes_documents():
    assert "torch-cp-flex" in bench.METHODS and "torch-cp-flex" in documents.METHODS
    assert "torch-cp-flex" in bench.OWN_KERNEL and "torch-cp-flex" in bench.OWN_COLLECTIVES
    from attnbench.cli import dist
    res = bench.CaseResult(spec=AttnSpec(), method="torch-cp-flex", kernel="sdpa-cudnn")
    assert dist._backend_name(res) == "cp-torch-cp-flex"  # --kernel does not apply: not in its name


def test_build_method_refuses_a_cpu_and_a_shared_gpu_as_unsupported():
    spec = AttnSpec(seqlens_q=(256, 256), heads_q=4, head_dim=16, dtype="fp32", causal=True)
    with pytest.raises(bench.MethodUnavailable, match="runs on CUDA only"):
        bench.build_method("torch-cp-flex", "sdpa-math", spec, _ctx(), ulysses_degree=None)
    with pytest.raises(bench.MethodUnavailable, match="own collectives"):
        bench.build_method("torch-cp-flex", "sdpa-math", spec, _ctx(ranks_per_device=2), ulysses_degree=None)
    with pytest.raises(ValueError, match="not a multiple of 256"):
        bench.build_method("torch-cp-flex", "sdpa-math", spec.replace(seqlens_q=(100, 284), seqlens_k=(100, 284)),
                           _ctx(), ulysses_degree=None)


def test_the_options_check_takes_documents_for_it_and_points_torch_cp_to_it():
    from attnbench.cli import dist
    docs = AttnSpec(seqlens_q=(300, 212), heads_q=4, head_dim=16, dtype="fp32", causal=True)
    dist.validate([docs], ["torch-cp-flex", "zigzag"], 2, None)
    dist.validate([AttnSpec(seqlens_q=(1024,), heads_q=4, head_dim=16, causal=False)], ["torch-cp-flex"], 4, None)
    with pytest.raises(UserError, match="run on ring, zigzag, ulysses, ulysses-ce, torch-cp-flex, not torch-cp; torch-cp's SDPA "
                                        "takes no document mask, torch-cp-flex is torch's context parallel with it"):
        dist.validate([docs], ["torch-cp"], 2, None)
    with pytest.raises(UserError, match="not a multiple of 512"):
        dist.validate([AttnSpec(seqlens_q=(768,), heads_q=4, head_dim=16)], ["torch-cp-flex"], 4, None)


def _doc_method(lengths, causal, idx, *, ignore_documents: bool):
    """A stand-in torch-cp-flex on one process: exact fp64 attention at the rows ``idx`` (all of them), under the
    document mask or, with ``ignore_documents``, the plain mask; its single-device reference made the same way."""
    pos = torch.arange(sum(lengths))
    mask = _grid(flex.document_mask_mod((sum(lengths),) if ignore_documents else lengths, causal), pos, pos)

    def fn(q, k, v):
        return _masked_attention(q, k, v, mask[idx][:, idx], q.shape[-1] ** -0.5)

    def reference(q, k, v, dout):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = _masked_attention(*leaves, mask, q.shape[-1] ** -0.5)
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
        return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}

    return bench.Method(name="torch-cp-flex", fn=fn, layout="per-document head-tail", positions=idx,
                        reference=reference)


@pytest.mark.parametrize("causal", [True, False])
def test_the_check_uses_the_peers_reference_at_its_rows_and_fails_one_that_ignores_the_documents(causal):
    lengths = (100, 156)
    spec = AttnSpec(seqlens_q=lengths, seqlens_k=lengths, heads_q=4, heads_kv=2, head_dim=16, dtype="fp64",
                    causal=causal)
    inputs = make_inputs(bench.dense_inputs_spec(spec), "cpu", 5)
    idx = torch.randperm(sum(lengths), generator=torch.Generator().manual_seed(1))  # rows in any order
    good = bench.check_rank(_doc_method(lengths, causal, idx, ignore_documents=False), None, spec, inputs, idx)
    assert all(t["pass"] for t in good.values()) and good["out"]["max"] < 1e-12
    bad = bench.check_rank(_doc_method(lengths, causal, idx, ignore_documents=True), None, spec, inputs, idx)
    # the same kernel on one device ignores them too (distributed == single device), yet the bound does not grow
    assert bad["out"]["max"] < 1e-12 and bad["out"]["single_err_vs_exact"] > 1e-3
    assert not bad["out"]["pass"] and not bad["dq"]["pass"]

"""Serving batches: the grammar, trace files, the serving fields of a spec, the per-request reference against a
loop over requests written out here (and the mistakes it must catch), naive and sdpa-math on each feature, the
command line, and the example trace of benchmarks/make_trace.py."""

import importlib.util
import json
import math
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from test_cli import attnbench

from attnbench import serving
from attnbench.accuracy.reference import BlockSizes, reference_attention
from attnbench.backends import registry
from attnbench.cli import common
from attnbench.inputs import dequantized, make_inputs
from attnbench.results.record import case_id
from attnbench.serving import Batch, describe, parse_batch, parse_tree, read_trace, tree_keep
from attnbench.spec import AttnSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "serving-trace.jsonl"
BACKENDS = ("naive", "sdpa-math")


# ---- the grammar ----------------------------------------------------------------------------------
def reqs(*groups):
    """(count, new, keys) groups -> the requests tuple."""
    return tuple((q, kv) for n, q, kv in groups for _ in range(n))


@pytest.mark.parametrize("text, expected", [
    ("q2k", reqs((1, 2048, 2048))),
    ("q17", reqs((1, 17, 17))),
    ("8q1kv1k", reqs((8, 1, 1024))),
    ("2q2k_32q1kv1k", reqs((2, 2048, 2048), (32, 1, 1024))),  # vLLM's spelling
    ("2q2k+32q1kv1k", reqs((2, 2048, 2048), (32, 1, 1024))),
    ("2q2k 32q1kv1k", reqs((2, 2048, 2048), (32, 1, 1024))),
    ("2q2k__32q1kv1k", reqs((2, 2048, 2048), (32, 1, 1024))),
    ("2Q2K_32Q1KV1K", reqs((2, 2048, 2048), (32, 1, 1024))),
    ("16q4s1k", reqs((16, 4, 1024))),  # vLLM's older 's' for keys
    ("1q1m", reqs((1, 1 << 20, 1 << 20))),
    ("q3kv1m", reqs((1, 3, 1 << 20))),
    ("4q1kv[1k,8k]", ((1, 1024), (1, 8192)) * 2),
    ("5q1kv[1,2,3]", ((1, 1), (1, 2), (1, 3), (1, 1), (1, 2))),  # a list is used in turn
    ("3q4kv[5, 6 ,7]", ((4, 5), (4, 6), (4, 7))),
    ("2x(q2k,kv4k)", reqs((2, 2048, 4096))),
    ("2x(q2k, kv4k)_q5kv9", reqs((2, 2048, 4096), (1, 5, 9))),
    ("q4kv4..4", reqs((1, 4, 4))),
])
def test_batches_parse(text, expected):
    batch = parse_batch(text)
    assert batch.requests == expected
    assert batch.name == text.strip()
    assert batch.seqlens_q == tuple(q for q, _ in expected) and batch.seqlens_k == tuple(k for _, k in expected)


def test_ranges_are_drawn_in_bounds_and_reproducible_by_seed():
    a, b, c = (parse_batch("128q1kv1k..32k", seed=s) for s in (7, 7, 8))
    assert a == b and a.requests != c.requests  # the seed decides the draw, and only the seed
    keys = a.seqlens_k
    assert a.seqlens_q == (1,) * 128 and all(1024 <= k <= 32768 for k in keys)
    assert len(set(keys)) > 100 and max(keys) > 24 * 1024 and min(keys) < 8 * 1024  # spread over the range


def test_grouped_spelling_with_counts_brackets_and_a_range():
    text = "2x(q2k,kv4k) + 3x(q1,kv1k..2k)"
    batch = parse_batch(text, seed=3)
    assert batch.requests[:2] == ((2048, 4096),) * 2
    assert [q for q, _ in batch.requests[2:]] == [1, 1, 1]
    assert all(1024 <= kv <= 2048 for _, kv in batch.requests[2:])
    assert parse_batch(text, seed=3) == batch
    lo, hi = min(batch.seqlens_k[2:]), max(batch.seqlens_k[2:])
    assert describe(batch.seqlens_q, batch.seqlens_k) == f"2q2kkv4k_3q1kv{lo}..{hi}"


@pytest.mark.parametrize("text, described", [
    ("q2k", "q2k"),
    ("q17", "q17"),
    ("8q1kv1k", "8q1kv1k"),
    ("2q2k_32q1kv1k", "2q2k_32q1kv1k"),
    ("2q2k+32q1kv1k", "2q2k_32q1kv1k"),
    ("16q4s1k", "16q4kv1k"),
    ("1q1m", "q1m"),
    ("2x(q2k,kv4k)", "2q2kkv4k"),
    ("3q5kv1000", "3q5kv1000"),
    ("4q1kv[1k,8k]", "4q1kv1k..8k"),  # a spread of keys is shown as its range
    ("2q1kv4_3q1kv8", "5q1kv4..8"),  # runs of equal new tokens are one group
    ("q3kv3_q3kv9", "2q3kv3..9"),
])
def test_describe(text, described):
    batch = parse_batch(text)
    assert describe(batch.seqlens_q, batch.seqlens_k) == described


@pytest.mark.parametrize("text", ["q2k", "8q1kv1k", "2q2k_32q1kv1k", "16q4s1k", "2x(q2k,kv4k)", "q5kv9_3q1kv1m"])
def test_describe_reads_back_as_the_same_batch(text):
    batch = parse_batch(text)
    assert parse_batch(describe(batch.seqlens_q, batch.seqlens_k)).requests == batch.requests


@pytest.mark.parametrize("text, needles", [
    ("q2k_4q3kv2", ["'4q3kv2'", "2 keys for 3 new tokens"]),  # keys count the new tokens
    ("4q2kv[1,8]", ["'4q2kv[1,8]'", "1 keys for 2 new tokens"]),
    ("q2k_4q1kv8..2", ["'4q1kv8..2'", "8..2 runs backwards"]),
    ("2q2k_zz", ["'zz'", "expected [count]q<new>[kv<keys>]"]),
    ("abc", ["'abc'"]),
    ("q2k,kv", ["'q2k,kv'"]),
    ("q1kv1..", ["'q1kv1..'"]),
    ("q0", ["'q0'", "must be positive"]),
    ("0q5", ["'0q5'", "must be positive"]),
    ("70000q1", ["more than 65536 requests"]),
    ("", ["empty batch"]),
    ("   ", ["empty batch"]),
])
def test_bad_batches_are_refused_naming_the_part(text, needles):
    with pytest.raises(ValueError) as err:
        parse_batch(text)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("text", ["_", " + ", "__"])
def test_separators_alone_are_an_empty_batch(text):
    with pytest.raises(ValueError, match="empty batch"):
        parse_batch(text)


def test_too_many_requests_are_refused_before_they_are_built(monkeypatch):
    counts = []
    keys = serving._keys
    monkeypatch.setattr(serving, "_keys", lambda spec, count, *rest: (counts.append(count), keys(spec, count, *rest))[1])
    with pytest.raises(ValueError, match="more than 65536 requests"):
        parse_batch("100000q1kv1..2")
    assert all(c <= serving.MAX_REQUESTS for c in counts)


def test_trees_parse_and_keep_ancestors():
    assert parse_tree("-1,0,0,1") == (-1, 0, 0, 1) and parse_tree(" -1, 0 ,1 ") == (-1, 0, 1)
    keep = tree_keep((-1, 0, 0, 1, -1))
    assert keep.tolist() == [[True, False, False, False, False],
                             [True, True, False, False, False],
                             [True, False, True, False, False],
                             [True, True, False, True, False],
                             [False, False, False, False, True]]
    assert serving.is_chain((-1, 0, 1, 2)) and not serving.is_chain((-1, 0, 0))
    assert tree_keep((-1, 0, 1, 2)).equal(torch.ones(4, 4, dtype=torch.bool).tril())  # a chain is causal
    assert serving.tree_label((-1, 0, 1)) == "tree3" and serving.tree_label((-1, 0, 0, 1, 1, 1)) == "tree6w3"


@pytest.mark.parametrize("text, needle", [
    ("0,1", "token 0's parent 0"), ("-1,1", "token 1's parent 1"), ("-1,-2", "token 1's parent -2"),
    ("-1,a", "give each new token's parent as integers"), ("", "at least one token"),
])
def test_bad_trees_are_refused(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_tree(text)


# ---- trace files ----------------------------------------------------------------------------------
def test_trace_jsonl_with_the_three_spellings_comments_and_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("# how it was made\n\n"
                    '{"name": "step 1", "requests": [[2, 5], [1, 9]]}\n'
                    "   \n"
                    '  # an indented comment\n'
                    '{"requests": [{"q": 3, "kv": 3}, {"q": 1, "kv": 4}]}\n'
                    '{"batch": "2q2kv4_q1kv[5]"}\n')
    assert read_trace(path) == [Batch(((2, 5), (1, 9)), name="step 1", traced=True),
                                Batch(((3, 3), (1, 4)), name="batch 2", traced=True),
                                Batch(((2, 4), (2, 4), (1, 5)), name="batch 3", traced=True)]
    assert not parse_batch("2q2kv4_q1kv5").traced


def test_trace_json_list(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"name": "a", "requests": [[1, 2], [4, 4]]}, {"batch": "3q1kv10..20"}], indent=2))
    first, second = read_trace(path)
    assert first == Batch(((1, 2), (4, 4)), name="a", traced=True)
    assert second.name == "batch 2" and second.seqlens_q == (1, 1, 1) and all(10 <= k <= 20 for k in second.seqlens_k)
    assert read_trace(path) == [first, second]  # a grammar range in a trace is drawn the same every time


@pytest.mark.parametrize("text, where, needle", [
    ('{"requests": [[1, 2]]}\n{oops\n', ":2:", "not JSON"),
    ('{"requests": [[1, 2]]}\n# c\n{"requests": [[1, 2, 3]]}\n', ":3:", "bad request [1, 2, 3]"),
    ('{"requests": [[1, 2], [4]]}\n', ":1:", "bad request [4]"),
    ('\n{"requests": [[5, 2]]}\n', ":2:", "bad request [5, 2]"),  # keys < new
    ('{"requests": [{"q": 3, "kv": 1}]}\n', ":1:", "keys >= new"),
    ('{"requests": [{"q": 1}]}\n', ":1:", "bad request {'q': 1}"),
    ('{"requests": [[true, 2]]}\n', ":1:", "bad request [True, 2]"),
    ('{"requests": [[1.0, 2]]}\n', ":1:", "bad request [1.0, 2]"),
    ('{"requests": [[0, 2]]}\n', ":1:", "bad request [0, 2]"),
    ('{"requests": []}\n', ":1:", "non-empty list"),
    ('{"name": "x"}\n', ":1:", "non-empty list"),
    ('{"batch": "2q3kv2"}\n', ":1:", "2 keys for 3 new tokens"),
    ('[{"requests": [[1, 2]]}, {"requests": [[3, 1]]}]', ": batch 2:", "bad request [3, 1]"),
    ('[{"requests": [[1, 2]]},\n {oops}]', ":2:", "not JSON"),
    ('# only a comment\n\n', " has no batches", "trace"),
])
def test_bad_traces_are_refused_naming_file_and_line(tmp_path, text, where, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_trace(path)
    assert str(path) + where in str(err.value) and needle in str(err.value)


def test_a_missing_trace_is_refused(tmp_path):
    with pytest.raises(ValueError, match="trace .*nowhere.jsonl: cannot read it"):
        read_trace(tmp_path / "nowhere.jsonl")


# ---- the serving fields of a spec -------------------------------------------------------------------
def serving_spec(**kw):
    base = dict(seqlens_q=(4, 4), seqlens_k=(9, 12), heads_q=4, heads_kv=2, head_dim=8, dtype="bf16", causal=True)
    return AttnSpec(**{**base, **kw})


@pytest.mark.parametrize("changes, needle", [
    (dict(tree=(-1, 0, 0)), "a tree of 3 tokens needs 3 new tokens in every request, not [4]"),
    (dict(seqlens_q=(4, 3), tree=(-1, 0, 0, 1)), "needs 4 new tokens in every request, not [3, 4]"),
    (dict(tree=(-1, 0, 0, 1), causal=False), "replaces the causal mask"),
    (dict(tree=(-1, 0, 0, 1), window=(4, 0)), "replaces the causal mask"),
    (dict(tree=(0, 0, 0, 1)), "token 0's parent 0"),
    (dict(shared_prefix=6), "a shared prefix of 6 tokens is cached, but a request with 4 new tokens over 9 keys has "
                            "only 5 cached"),
    (dict(seqlens_q=(4,), seqlens_k=(12,), shared_prefix=2), "needs a batch of several requests"),
    (dict(seqlens_q=(4,), seqlens_k=(12,), batch=2, shared_prefix=2), "needs a batch of several requests"),
    (dict(shared_prefix=-1), "shared prefix must be a whole number"),
    (dict(shared_prefix=True), "shared prefix must be a whole number"),
    (dict(kv_dtype="fp8", dtype="fp32"), "takes fp16 or bf16 queries, not fp32"),
    (dict(kv_dtype="fp8", dtype="fp8"), "takes fp16 or bf16 queries, not fp8"),
    (dict(kv_dtype="bf16"), "KV cache dtype must be one of fp8, fp8-head"),
    (dict(kv_dtype="int4"), "unknown dtype 'int4'"),
    (dict(kv_dtype="fp8", pass_="fwd_bwd"), "fp8 KV cache is an inference feature: forward only"),
    (dict(tree=(-1, 0, 0, 1), pass_="bwd"), "tree is an inference feature: forward only"),
    (dict(shared_prefix=2, pass_="fwd_bwd"), "shared prefix is an inference feature"),
    (dict(page_size=16, pass_="fwd_bwd"), "page size is an inference feature"),
    (dict(page_size=0), "page size must be an integer in 1..65536"),
    (dict(page_size=65537), "page size must be an integer in 1..65536"),
    (dict(page_size=True), "page size must be an integer"),
    (dict(page_size=16.0), "page size must be an integer"),
    (dict(shared_prefix=2, sinks=True), "do not combine with shared prefixes"),
    (dict(kv_dtype="fp8", softcap=30.0), "do not combine"),
])
def test_serving_fields_are_validated(changes, needle):
    with pytest.raises(ValueError) as err:
        serving_spec(**changes)
    assert needle in str(err.value)


def test_valid_serving_fields_and_their_label():
    spec = serving_spec(page_size=16, shared_prefix=5, tree=[-1, 0, 0, 1], kv_dtype="e4m3")
    assert spec.tree == (-1, 0, 0, 1) and spec.kv_dtype == "fp8" and spec.quantized
    assert spec.serving_features == ("page size", "shared prefix", "tree", "fp8 KV cache")
    assert spec.label().endswith("causal prefix5 tree4w2 kv-fp8 page16")
    for page in (1, 65536):
        assert serving_spec(page_size=page).page_size == page
    assert serving_spec(page_size=16, dtype="fp32", pass_="fwd").page_size == 16  # pages alone need no fp8
    many = AttnSpec(seqlens_q=(2,) * 3 + (1,) * 7, seqlens_k=(2,) * 3 + (64,) * 7, heads_q=2, head_dim=8)
    assert "reqs[3q2_7q1kv64]" in many.label()


def test_old_cases_keep_their_ids():
    # ids computed by the commit before serving batches (2eaa486): the new fields, when off, are not in the dict
    old = [(AttnSpec(batch=2, seqlens_q=(128,), heads_q=4, head_dim=64, dtype="fp32", causal=True, pass_="fwd"),
            "910466cd0907f00d"),
           (AttnSpec(seqlens_q=(5, 1, 1), seqlens_k=(9, 20, 33), heads_q=4, heads_kv=2, head_dim=16, dtype="bf16",
                     causal=True, pass_="fwd"), "619f7baea1be77ac")]
    for spec, cid in old:
        assert not {"page_size", "shared_prefix", "tree", "kv_dtype"} & set(spec.to_dict())
        assert case_id(spec, "naive", "cpu") == cid


def test_serving_fields_round_trip_through_the_dict():
    spec = serving_spec(page_size=16, shared_prefix=5, tree=(-1, 0, 0, 1), kv_dtype="fp8-head")
    data = json.loads(json.dumps(spec.to_dict()))
    assert (data["page_size"], data["shared_prefix"], data["tree"], data["kv_dtype"]) == (16, 5, [-1, 0, 0, 1], "fp8-head")
    again = AttnSpec.from_dict(data)
    assert again == spec and case_id(again, "naive", "cpu") == case_id(spec, "naive", "cpu")
    assert set(serving_spec(shared_prefix=3).to_dict()) - set(serving_spec().to_dict()) == {"shared_prefix"}


# ---- the reference, per request, against a loop written out here -------------------------------------
def causal_keep(sq: int, sk: int) -> torch.Tensor:
    """Lower-right aligned causal mask, element by element."""
    return torch.tensor([[j <= i + sk - sq for j in range(sk)] for i in range(sq)])


def ancestors(parents, i: int) -> set[int]:
    """Token i and its ancestors among the new tokens, walking up the parent list."""
    out = set()
    while i != -1:
        out.add(i)
        i = parents[i]
    return out


def tree_mask(parents):
    """keep(sq, sk) of a tree: every cached key, and the new tokens that are the query or its ancestors."""
    def keep(sq: int, sk: int) -> torch.Tensor:
        assert sq == len(parents)
        cached = sk - sq
        return torch.tensor([[j < cached or j - cached in ancestors(parents, i) for j in range(sk)] for i in range(sq)])
    return keep


def loop_attention(q, k, v, lengths, scale, keep=causal_keep):
    """out (Tq, Hq, Dv) and lse (Hq, Tq) in fp64: plain softmax, one request at a time, an explicit mask."""
    groups = q.shape[1] // k.shape[1]
    outs, lses, qo, ko = [], [], 0, 0
    for sq, sk in lengths:
        qi = q[qo:qo + sq].double()
        ki, vi = (t[ko:ko + sk].double().repeat_interleave(groups, dim=1) for t in (k, v))
        s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
        s = s.masked_fill(~keep(sq, sk), -math.inf)
        lses.append(torch.logsumexp(s, dim=-1))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vi))
        qo, ko = qo + sq, ko + sk
    assert (qo, ko) == (q.shape[0], k.shape[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def by_hand(t8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """An e4m3 (T, Hkv, D) tensor as the values it stands for: stored x its KV head's descale, in fp64."""
    return t8.double() * descale.double()[None, :, None]


def written_out(spec: AttnSpec, inputs):
    """The expected output of a serving case from its compact inputs: each request's keys written out here (the
    shared prefix in front), an fp8 cache dequantized here, the causal or tree mask built here."""
    k, v, pk, pv = inputs.k, inputs.v, inputs.prefix_k, inputs.prefix_v
    if spec.kv_dtype is not None:
        _, dk, dv = inputs.descale
        k, v = by_hand(k, dk), by_hand(v, dv)
        pk, pv = (None, None) if pk is None else (by_hand(pk, dk), by_hand(pv, dv))
    lengths = spec.sequences
    if spec.shared_prefix:
        own = [sk - spec.shared_prefix for _, sk in lengths]
        ends = [sum(own[:i + 1]) for i in range(len(own))]
        k, v = (torch.cat([t for e, n in zip(ends, own) for t in (p, x[e - n:e])]) for p, x in ((pk, k), (pv, v)))
    keep = causal_keep if spec.tree is None else tree_mask(spec.tree)
    return loop_attention(inputs.q, k, v, lengths, spec.softmax_scale, keep)


MIXED = parse_batch("2q5kv9_3q1kv4..12_2q3kv[7,10]", seed=1)  # prefills, decodes and spec-decode requests
PREFIXED = parse_batch("2q3kv11_3q1kv6..12", seed=2)
TREE = (-1, 0, 0, 1, 1, 2, -1)  # two roots, widths 2, 2, 1 under them
TREE_BATCH = parse_batch("3q7kv[7,10,15]")


def spec_of(batch: Batch, **kw) -> AttnSpec:
    return AttnSpec(seqlens_q=batch.seqlens_q, seqlens_k=batch.seqlens_k, heads_q=4, heads_kv=2, head_dim=8,
                    dtype=kw.pop("dtype", "fp64"), causal=True, **kw)


FEATURES = {
    "mixed": spec_of(MIXED),
    "prefix": spec_of(PREFIXED, shared_prefix=4),
    "tree": spec_of(TREE_BATCH, tree=TREE),
    "fp8": spec_of(MIXED, dtype="bf16", kv_dtype="fp8"),
    "fp8-head": spec_of(MIXED, dtype="bf16", kv_dtype="fp8-head"),
    "all": spec_of(parse_batch("3q4kv[9,12,20]"), dtype="fp16", shared_prefix=5, tree=(-1, 0, 0, 2), kv_dtype="fp8-head"),
}


def test_mixed_batch_reference_is_the_loop_over_requests():
    spec = FEATURES["mixed"]
    assert spec.sequences == list(MIXED.requests) and {q for q, _ in MIXED.requests} == {1, 3, 5}
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, grads=False)
    out, lse = loop_attention(inputs.q, inputs.k, inputs.v, MIXED.requests, spec.softmax_scale)
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)


def test_a_request_reading_another_requests_keys_is_caught():
    spec = FEATURES["mixed"]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, grads=False).out
    (q0, k0), (q1, k1) = MIXED.requests[:2]
    assert (q0, k0) == (q1, k1)  # two prefills of 5 over 9 keys: swap their keys and values
    k, v = inputs.k.clone(), inputs.v.clone()
    for t in (k, v):
        t[:k0], t[k0:2 * k0] = t[k0:2 * k0].clone(), t[:k0].clone()
    mutated, _ = loop_attention(inputs.q, k, v, MIXED.requests, spec.softmax_scale)
    err = (mutated - ref).abs()
    assert err[:2 * q0].max() > 1e-2  # the two requests' rows are wrong...
    assert err[2 * q0:].max() < 1e-12  # ...and only theirs


def test_shared_prefix_reference_is_the_loop_over_the_expanded_keys():
    spec = FEATURES["prefix"]
    inputs = make_inputs(spec)
    prefix, own = spec.shared_prefix, [sk - spec.shared_prefix for _, sk in PREFIXED.requests]
    assert inputs.prefix_k.shape == (prefix, 2, 8) and inputs.k.shape[0] == sum(own)  # stored once
    assert inputs.cu_seqlens_k.tolist() == [sum(own[:i]) for i in range(len(own) + 1)]
    full = inputs.expanded()
    assert full.prefix_k is None and full.cu_seqlens_k.tolist() == [sum(PREFIXED.seqlens_k[:i]) for i in range(6)]
    starts = full.cu_seqlens_k.tolist()[:-1]
    for start in starts:  # the prefix is in front of every request's own keys
        assert full.k[start:start + prefix].equal(inputs.prefix_k) and full.v[start:start + prefix].equal(inputs.prefix_v)
    ref = reference_attention(spec, inputs, grads=False)  # on the compact inputs
    out, lse = loop_attention(full.q, full.k, full.v, PREFIXED.requests, spec.softmax_scale)
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)
    torch.testing.assert_close(written_out(spec, inputs)[0], out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="forward only"):
        reference_attention(spec, inputs, grads=True)


def test_a_prefix_not_shared_is_caught():
    spec = FEATURES["prefix"]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, grads=False).out
    full = inputs.expanded()
    k, v, prefix = full.k.clone(), full.v.clone(), spec.shared_prefix
    start = full.cu_seqlens_k.tolist()[1]  # request 1 gets a prefix of its own
    gen = torch.Generator().manual_seed(1)
    k[start:start + prefix] = torch.randn(prefix, 2, 8, generator=gen, dtype=k.dtype)
    v[start:start + prefix] = torch.randn(prefix, 2, 8, generator=gen, dtype=v.dtype)
    mutated, _ = loop_attention(full.q, k, v, PREFIXED.requests, spec.softmax_scale)
    err = (mutated - ref).abs()
    rows = full.cu_seqlens_q.tolist()[1:3]
    assert err[rows[0]:rows[1]].max() > 1e-2
    assert torch.cat([err[:rows[0]], err[rows[1]:]]).max() < 1e-12


@pytest.mark.parametrize("blocks", [None, BlockSizes(q=2, k=3)], ids=["default-blocks", "small-blocks"])
def test_tree_reference_is_the_loop_with_the_ancestor_mask(blocks):
    spec = FEATURES["tree"]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, grads=False, blocks=blocks)
    out, lse = loop_attention(inputs.q, inputs.k, inputs.v, TREE_BATCH.requests, spec.softmax_scale, tree_mask(TREE))
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)
    # the mask built here is tree_keep's (and a chain's is the causal mask)
    assert tree_mask(TREE)(7, 10)[:, 3:].equal(tree_keep(TREE))
    assert tree_mask((-1, 0, 1, 2))(4, 9).equal(causal_keep(4, 9))


def test_a_dropped_tree_edge_is_caught():
    spec = FEATURES["tree"]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, grads=False).out
    dropped = list(TREE)
    dropped[3] = -1  # token 3 no longer sees its parent 1 nor 0
    mutated, _ = loop_attention(inputs.q, inputs.k, inputs.v, TREE_BATCH.requests, spec.softmax_scale,
                                tree_mask(dropped))
    err = (mutated - ref).abs().view(3, 7, 4, 8)  # requests, tokens, heads, dims
    assert err[:, 3].amax(dim=(1, 2)).min() > 1e-2  # token 3 of every request is wrong
    assert err[:, [0, 1, 2, 4, 5, 6]].max() < 1e-12  # token 3 is nobody's ancestor: the others are right


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8-head"])
def test_fp8_kv_cache_reference_is_the_loop_over_the_dequantized_cache(kv_dtype):
    spec = FEATURES[kv_dtype]
    inputs = make_inputs(spec)
    dq, dk, dv = inputs.descale
    assert inputs.q.dtype == torch.bfloat16 and inputs.k.dtype == inputs.v.dtype == torch.float8_e4m3fn
    assert dq.equal(torch.ones(2)) and (dk.unique().numel() == 1) == (kv_dtype == "fp8")  # one descale, or per head
    plain = inputs.unquantized
    for t8, d, t in ((inputs.k, dk, plain.k), (inputs.v, dv, plain.v)):  # stored x descale stands for the bf16 values
        reached = t8.float().abs().amax(dim=(0, 2)) == 448  # amax lands on e4m3's largest value
        assert reached.all() if kv_dtype == "fp8-head" else reached.any()
        assert ((by_hand(t8, d) - t.double()).abs() <= t.double().abs() / 16 + d.double().max() * 2 ** -9).all()
    ref = reference_attention(spec, dequantized(inputs, torch.float64), grads=False)
    out, _ = loop_attention(inputs.q, by_hand(inputs.k, dk), by_hand(inputs.v, dv), MIXED.requests, spec.softmax_scale)
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    naive = registry.get("naive").prepare_case(spec, inputs).fn().out
    assert naive.dtype == torch.bfloat16
    torch.testing.assert_close(naive.double(), out, rtol=0, atol=3e-2)


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8-head"])
def test_fp8_scales_ignored_are_caught(kv_dtype):
    spec = FEATURES[kv_dtype]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, dequantized(inputs, torch.float64), grads=False).out
    _, dk, dv = inputs.descale
    for k, v in ((inputs.k, by_hand(inputs.v, dv)), (by_hand(inputs.k, dk), inputs.v), (inputs.k, inputs.v)):
        mutated, _ = loop_attention(inputs.q, k, v, MIXED.requests, spec.softmax_scale)  # k, v or both undescaled
        assert (mutated - ref).abs().max() > 1e-2


@pytest.mark.parametrize("name", list(FEATURES))
def test_reference_is_the_written_out_case(name):
    spec = FEATURES[name]
    inputs = make_inputs(spec)
    ref = reference_attention(spec, dequantized(inputs, torch.float64), grads=False)
    out, lse = written_out(spec, inputs)
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(FEATURES))
def test_cpu_backends_agree_with_the_reference(backend, name):
    spec = FEATURES[name]
    be = registry.get(backend)
    assert be.supports(spec, "cpu") is None
    inputs = make_inputs(spec)
    got = be.prepare_case(spec, inputs).fn().out
    ref = reference_attention(spec, dequantized(inputs, torch.float64), grads=False).out
    assert got.shape == ref.shape and got.dtype == spec.torch_dtype
    exact = spec.dtype == "fp64"
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-10 if exact else 3e-2)
    assert torch.equal(make_inputs(spec).q, inputs.q)  # the inputs are the same draw for every backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_backends_skip_a_paged_case(backend):
    spec = FEATURES["mixed"].replace(page_size=16)
    assert "no paged KV cache" in registry.get(backend).supports(spec, "cpu")


# ---- sweeps and the command line ------------------------------------------------------------------
def test_batches_make_a_serving_sweep_and_trees_pick_their_batches():
    sweep = common.build_sweep({"batch": ["2q4kv9_q4kv4", "q1kv8_3q2kv5..9"], "tree": ["-1,0,0,1", "none"],
                                "shared_prefix": ["0"], "seed": 5}, "cpu")
    specs = sweep.specs()
    assert [(s.seqlens_q, s.tree) for s in specs] == [((4, 4, 4), (-1, 0, 0, 1)), ((4, 4, 4), None),
                                                      ((1, 2, 2, 2), None)]
    assert all((s.causal, s.pass_, s.dtype, s.heads_q, s.head_dim) == (True, "fwd", "bf16", 32, 128) for s in specs)
    assert specs[2].seqlens_k[1:] == parse_batch("q1kv8_3q2kv5..9", seed=5).seqlens_k[1:]  # drawn with --seed
    with pytest.raises(ValueError, match="no case has 2 new tokens in every request"):
        common.build_sweep({"batch": ["2q4kv8_q1kv3"], "tree": ["-1,0"]}, "cpu").specs()


TINY = ["--device", "cpu", "--q-heads", "4", "--kv-heads", "2", "--head-size", "16", "--backends", "naive,sdpa-math",
        "--warmup", "0", "--repeat", "2", "--quiet"]


def records(db):
    with sqlite3.connect(db) as conn:
        return [(b, json.loads(s), label, status, reason, json.loads(acc or "null"))
                for b, s, label, status, reason, acc in
                conn.execute("SELECT backend, spec, label, status, reason, accuracy FROM records")]


def test_cli_runs_a_batch_with_a_prefix_an_fp8_cache_and_pages(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", *TINY, "--batch", "2q3kv9_3q1kv5..12", "--shared-prefix", "0", "--shared-prefix", "4",
                    "--kv-dtype", "same", "--kv-dtype", "fp8", "--page-size", "none", "--page-size", "16",
                    "--db", str(db))
    assert res.returncode == 0, res.stderr
    rows = records(db)
    assert len(rows) == 16  # 2 prefixes x 2 KV dtypes x 2 page sizes, two backends
    settings = {(s.get("shared_prefix", 0), s.get("kv_dtype"), s.get("page_size")) for _, s, *_ in rows}
    assert settings == {(p, k, g) for p in (0, 4) for k in (None, "fp8") for g in (None, 16)}
    for backend, spec, label, status, reason, acc in rows:
        assert spec["seqlens_q"] == [3, 3, 1, 1, 1] and spec["seqlens_k"][:2] == [9, 9] and spec["dtype"] == "bf16"
        assert ("prefix4" in label) == (spec.get("shared_prefix") == 4) and ("kv-fp8" in label) == ("kv_dtype" in spec)
        if spec.get("page_size"):
            assert status == "unsupported" and "paged" in reason  # neither reads a paged cache
        else:
            assert status == "ok" and acc["verdict"] in ("pass", "approx-pass"), (backend, label, acc)
            assert (acc["verdict"] == "approx-pass") == ("kv_dtype" in spec)


def test_cli_replays_a_trace_with_a_tree(tmp_path):
    trace, db = tmp_path / "t.jsonl", tmp_path / "r.db"
    trace.write_text('# two steps\n{"name": "spec", "requests": [[4, 6], [4, 9], {"q": 4, "kv": 4}]}\n\n'
                     '{"batch": "2q3kv7_q1kv5"}\n')
    res = attnbench("run", *TINY, "--dtype", "fp32", "--batch-trace", str(trace), "--tree", "-1,0,0,1",
                    "--tree", "none", "--db", str(db))
    assert res.returncode == 0, res.stderr
    rows = records(db)
    assert len(rows) == 6  # the tree only on the batch of 4-token requests: 3 cases, two backends
    cases = {(tuple(s["seqlens_q"]), tuple(s["seqlens_k"]), tuple(s.get("tree") or ())) for _, s, *_ in rows}
    assert cases == {((4, 4, 4), (6, 9, 4), (-1, 0, 0, 1)), ((4, 4, 4), (6, 9, 4), ()), ((3, 3, 1), (7, 7, 5), ())}
    for _, spec, label, status, _, acc in rows:
        assert status == "ok" and acc["verdict"] == "pass" and ("tree4w2" in label) == ("tree" in spec)


def test_a_traces_steps_keep_their_names_and_order_in_records_and_summary(tmp_path):
    trace, db = tmp_path / "t.jsonl", tmp_path / "r.db"
    steps = {"step 9": [[1, 40], [1, 33], [5, 60]], "step 10": [[1, 41], [1, 34], [1, 61]],
             "step 11": [[2, 42], [1, 35]]}
    trace.write_text("".join(json.dumps({"name": n, "requests": r}) + "\n" for n, r in steps.items()))
    res = attnbench("run", *TINY, "--dtype", "fp32", "--batch-trace", str(trace), "--batch", "2q3kv7_q1kv5",
                    "--db", str(db))
    assert res.returncode == 0, res.stderr
    res = attnbench("show", "--db", str(db))  # the summary
    with sqlite3.connect(db) as conn:
        named = {(tuple(json.loads(spec)["seqlens_k"]), json.loads(info).get("batch_name"))
                 for spec, info in conn.execute("SELECT spec, info FROM records")}
    assert named == {((40, 33, 60), "step 9"), ((41, 34, 61), "step 10"), ((42, 35), "step 11"), ((7, 7, 5), None)}
    import re
    assert re.findall(r"step \d+", res.stdout) == ["step 9", "step 10", "step 11"], res.stdout  # the trace's order


@pytest.mark.parametrize("args, needle", [
    (["--batch", "q4kv8_2q2k_zz"], "bad --batch: cannot read 'zz'"),
    (["--batch-trace", "TRACE"], "t.jsonl:3: not JSON"),
    (["--batch", "2q4kv8", "--seq-lens", "16"], "--batch / --batch-trace give each request's lengths: drop --seq-lens"),
    (["--batch", "2q4kv8", "--tree", "0,1"], "bad --tree: tree [0, 1]: token 0's parent 0"),
    (["--batch", "2q4kv8", "--kv-dtype", "int4"], "bad --kv-dtype 'int4': fp8, fp8-head or same"),
    (["--batch", "2q4kv8", "--shared-prefix", "6"], "a shared prefix of 6 tokens is cached"),  # from the spec
])
def test_cli_errors_are_one_line_with_status_2(tmp_path, args, needle):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"requests": [[1, 4]]}\n# fine so far\n{"requests": [[1, 4]\n')
    args = [str(trace) if a == "TRACE" else a for a in args]
    res = attnbench("run", "--device", "cpu", "--quiet", *args, "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnbench: error:") and needle in lines[0], res.stderr


def test_cli_serving_axes_take_several_values_after_one_flag(tmp_path):
    res = attnbench("run", *TINY, "--batch", "2q2kv6", "--page-size", "none", "16", "--shared-prefix", "0", "2",
                    "--db", str(tmp_path / "r.db"))
    assert res.returncode == 0, res.stderr


# ---- the example trace ----------------------------------------------------------------------------
def test_the_example_trace_reads_and_is_a_mixed_long_tailed_server_step():
    assert EXAMPLE.stat().st_size < 300_000
    header = EXAMPLE.read_text().splitlines()[0]
    assert header.startswith("# made by: python3 benchmarks/make_trace.py --steps 40 --seed 0")
    batches = read_trace(EXAMPLE)
    assert len(batches) == 40 and all(b.name.startswith("step ") for b in batches)
    requests = [r for b in batches for r in b.requests]
    decodes = [kv for q, kv in requests if q == 1]
    chunks = [q for q, _ in requests if q > 1]
    assert sum(any(q > 1 for q in b.seqlens_q) for b in batches) >= 20  # most steps prefill something...
    assert len(decodes) >= 0.9 * len(requests) and all(len(b.requests) >= 64 for b in batches)  # ...among decodes
    assert all(len(b.requests) <= 256 and sum(b.seqlens_q) <= 8192 for b in batches)  # the scheduler's limits
    assert max(chunks) <= 2048 and min(chunks) < 2048 and all(kv >= q for q, kv in requests)
    keys = sorted(kv for _, kv in requests)
    median = keys[len(keys) // 2]
    assert 512 <= median <= 4096 and keys[-1] >= 8 * median and keys[-1] <= 32768 + 4096  # a long tail, capped


def test_make_trace_reproduces_the_example(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_trace", ROOT / "benchmarks" / "make_trace.py")
    make_trace = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_trace", make_trace)  # its dataclass looks its module up
    spec.loader.exec_module(make_trace)
    out = tmp_path / "trace.jsonl"
    assert make_trace.main(["--out", str(out)]) == 0
    assert out.read_text() == EXAMPLE.read_text()  # the defaults wrote the shipped file
    assert make_trace.main(["--out", str(out), "--steps", "3", "--seed", "1", "--warmup", "50"]) == 0
    batches = read_trace(out)
    assert len(batches) == 3 and "--steps 3 --seed 1" in out.read_text().splitlines()[0]
    assert "3 steps" in capsys.readouterr().err


def test_exports_carry_the_serving_features():
    from attnbench.results import export
    spec = AttnSpec(seqlens_q=(4, 4), seqlens_k=(40, 50), heads_q=4, heads_kv=2, head_dim=16, causal=True,
                    page_size=16, shared_prefix=8, tree=(-1, 0, 0, 1), kv_dtype="fp8")
    row, = export.export_rows([{"status": "ok", "spec": json.dumps(spec.to_dict())}])
    assert (row["page_size"], row["shared_prefix"], row["tree"], row["kv_dtype"], row["mla"]) == (
        16, 8, [-1, 0, 0, 1], "fp8", False)
    plain, = export.export_rows([{"status": "ok", "spec": json.dumps(AttnSpec().to_dict())}])
    assert (plain["page_size"], plain["shared_prefix"], plain["tree"], plain["kv_dtype"]) == (None, 0, None, None)


def test_a_tree_counts_the_pairs_it_keeps_not_the_causal_triangle():
    from attnbench import metrics
    chain = AttnSpec(seqlens_q=(4, 4), seqlens_k=(40, 50), heads_q=2, head_dim=8, causal=True, tree=(-1, 0, 1, 2))
    causal = chain.replace(tree=None)
    assert metrics.pairs(chain) == metrics.pairs(causal)  # a chain is the causal mask
    wide = chain.replace(tree=(-1, 0, 0, 1))  # token 2 sees 0 and itself; token 3 sees 1, 0 and itself
    keep = sum(len(a) for a in ([0], [0, 1], [0, 2], [0, 1, 3]))
    assert metrics.pairs(wide) == (36 * 4 + keep) + (46 * 4 + keep) < metrics.pairs(causal)


def test_many_lengths_without_repeats_are_counted_not_listed():
    from attnbench.distributed.documents import long_tailed
    from attnbench.serving import MAX_DESCRIBED, short_description
    lengths = long_tailed(524288, 8192, seed=0)
    assert short_description(lengths, lengths) == f"{len(lengths)} seqs of 524288 tokens, longest {max(lengths)}"
    keys = tuple(n + 10 for n in lengths)
    assert short_description(lengths, keys).endswith(f", {sum(keys)} keys, longest {max(lengths)}")
    few = (1,) * 16 + (5,) * 4  # runs fold into a short text: kept
    assert short_description(few, few) == "16q1_4q5" and len("16q1_4q5") <= MAX_DESCRIBED
    spec = AttnSpec(seqlens_q=lengths, heads_q=2, head_dim=16, dtype="fp32")
    assert f"reqs[{len(lengths)}:q{min(lengths)}..{max(lengths)}]" in spec.label() and len(spec.label()) < 60

"""--fresh-inputs (timing/fresh.py): the timed calls rotate over input sets of their own values, and a kernel
that caches its output by its input's address, which passes on the same inputs, fails."""

import dataclasses

import pytest
import torch

from attnbench import api
from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Prepared
from attnbench.backends.naive import NaiveBackend
from attnbench.inputs import make_inputs
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig
from attnbench.timing.fresh import FRESH_SETS, FreshInputs, overwrite

SPEC = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16, dtype="fp32")  # small: a cached call's speed is possible


def _address_cached(base, name: str | None = None):
    """``base`` behind a cache keyed by its inputs' ``q.data_ptr()`` that outlives a preparation (as a kernel
    library's own cache would): a later call at a known address returns the stored outputs."""
    class Cached(base):
        cache: dict = {}

        def prepare(self, spec, inputs):
            inner = super().prepare(spec, inputs).fn

            def call():
                key = (inputs.q.data_ptr(), spec.pass_)
                if key not in Cached.cache:
                    Cached.cache[key] = inner()
                return Cached.cache[key]
            return Prepared(fn=call)
    Cached.name = name or f"test-cached-{base.name}"
    return Cached


AddressCache = _address_cached(NaiveBackend, "test-address-cache")
"""Naive attention behind the address cache."""


class OneBehind(Backend):
    """Returns the result of the call before (any preparation's): right whenever the inputs did not change."""

    name = "test-one-behind"
    capabilities = Capabilities()
    previous: list = []

    def prepare(self, spec, inputs):
        inner = NaiveBackend().prepare(spec, inputs).fn

        def call():
            now = inner()
            out = OneBehind.previous[0] if OneBehind.previous else now
            OneBehind.previous[:] = [now]
            return out
        return Prepared(fn=call)


@pytest.fixture(autouse=True)
def _backends():
    for cls in (AddressCache, OneBehind):
        registry.register(cls.name, cls)
    AddressCache.cache.clear()
    OneBehind.previous.clear()
    yield
    for cls in (AddressCache, OneBehind):
        registry.unregister(cls.name)


def run(spec, names, fresh: bool):
    timing = TimingConfig(warmup=1, repeat=5, fresh_inputs=fresh)
    runner = Runner(RunOptions(device="cpu", backends=tuple(names), timing=timing), run_id="t", env_id=None,
                    sink=lambda r: None, checker=AccuracyChecker())
    return {r.backend: r for r in runner.run([spec])}


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_a_kernel_caching_by_address_passes_on_the_same_inputs_and_fails_with_fresh_ones(pass_):
    spec = SPEC.replace(pass_=pass_)
    same = run(spec, [AddressCache.name], fresh=False)[AddressCache.name]
    assert same.status != "mismatch" and same.accuracy["verdict"] == "pass"
    assert "fresh_inputs" not in same.accuracy and "fresh_inputs" not in same.info
    AddressCache.cache.clear()
    fresh = run(spec, [AddressCache.name], fresh=True)[AddressCache.name]
    assert fresh.status == "mismatch", fresh.reason
    assert fresh.reason.startswith("fresh inputs, new values in the inputs of an earlier call: out")
    assert fresh.accuracy["fresh_inputs"]["new_values"]["verdict"] == "fail"
    assert fresh.accuracy["verdict"] == "fail" and fresh.tflops is not None  # a mismatch keeps its time


def test_a_kernel_answering_with_an_earlier_calls_result_fails_the_last_call_check():
    same = run(SPEC, [OneBehind.name], fresh=False)[OneBehind.name]
    assert same.status == "ok" and same.accuracy["verdict"] == "pass"
    OneBehind.previous.clear()
    fresh = run(SPEC, [OneBehind.name], fresh=True)[OneBehind.name]
    # the call after the timed ones fails first (it returns the last timed call's result, of other values);
    # the check of the last timed call says so on its own
    assert fresh.status == "mismatch"
    assert fresh.accuracy["fresh_inputs"]["last_call"]["verdict"] == "fail"


@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd_bwd"])
def test_correct_kernels_pass_with_fresh_inputs(pass_):
    spec = AttnSpec(seqlens_q=(40, 64), heads_q=4, heads_kv=2, head_dim=16, dtype="fp32", causal=True, pass_=pass_)
    for name, record in run(spec, ["naive", "sdpa-math"], fresh=True).items():
        assert record.status == "ok", (name, record.reason)
        assert record.info["fresh_inputs"] == {"sets": FRESH_SETS}
        checks = record.accuracy["fresh_inputs"]
        assert checks["last_call"]["verdict"] == "pass" and checks["new_values"]["verdict"] == "pass"


class SeedOf(Backend):
    """Returns the seed of the inputs it was prepared over (no attention: to see which set a call got)."""

    name = "test-seed-of"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        return Prepared(fn=lambda: inputs.seed)


def test_the_timed_calls_take_the_sets_in_turn():
    inputs = make_inputs(SPEC, seed=7)
    backend = SeedOf()
    fresh = FreshInputs(SPEC, backend, inputs, backend.prepare(SPEC, inputs), seed=7)
    call = fresh.rotation()
    seen = [call() for _ in range(2 * FRESH_SETS + 1)]
    assert seen == [7, 8, 9, 10] * 2 + [7]
    assert fresh.last == (0, 7) and fresh.describe() == {"sets": FRESH_SETS}
    drawn = fresh.sets[2][0]
    assert torch.equal(drawn.q, make_inputs(SPEC, seed=9).q) and not torch.equal(drawn.q, inputs.q)


def test_the_cases_values_go_into_a_seen_set_never_the_other_way():
    inputs = make_inputs(SPEC, seed=0)
    own = {name: t.clone() for name, t in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v), ("dout", inputs.dout))}
    backend = NaiveBackend()
    fresh = FreshInputs(SPEC, backend, inputs, backend.prepare(SPEC, inputs), seed=0)
    fresh.closures()[0]()  # the last call was on the case's own set
    fresh.extend(2)
    seen_set = fresh.sets[1][0]
    seen = []

    def checker(spec, checked, outputs, backend):
        seen.append(checked)
        return {"verdict": "pass"}
    accuracy = fresh.check(checker, {"verdict": "pass"})
    assert accuracy["fresh_inputs"]["new_values"] == {"verdict": "pass"}
    for name, before in own.items():
        assert torch.equal(getattr(inputs, name), before)
    # the last call (set 0) and the call on the case's values written into set 1: both the case's reference
    assert seen == [inputs, inputs]
    address = seen_set.q.data_ptr()
    assert torch.equal(seen_set.q, inputs.q) and seen_set.q.data_ptr() == address  # written in place
    assert fresh.sets[1][0].q.data_ptr() == address and fresh.sets[1][0].seed == inputs.seed


def test_overwrite_keeps_addresses_and_views():
    mla = AttnSpec(seqlens_q=(1,), seqlens_k=(32,), heads_q=4, heads_kv=1, head_dim=64, head_dim_v=32,
                   dtype="bf16", mla=True)
    dst, src = make_inputs(mla, seed=1), make_inputs(mla, seed=2)
    assert dst.v.data_ptr() == dst.k.data_ptr()  # MLA: the values are a view of the keys
    addresses = {name: getattr(dst, name).data_ptr() for name in ("q", "k", "v", "dout")}
    overwrite(dst, src)
    for name, address in addresses.items():
        assert getattr(dst, name).data_ptr() == address and torch.equal(getattr(dst, name), getattr(src, name))
    gated = SPEC.replace(gate=True, sinks=True)
    dst, src = make_inputs(gated, seed=1), make_inputs(gated, seed=2)
    overwrite(dst, src)
    assert set(dst.extra) == {"gate", "sinks"} and all(torch.equal(t, src.extra[n]) for n, t in dst.extra.items())


def test_the_option_reaches_the_timing_and_external_profilers_refuse_it():
    plan = api.plan(device="cpu", backends="naive", seq_lens=64, fresh_inputs=True)
    assert plan.options.timing.fresh_inputs is True
    assert api.plan(device="cpu", backends="naive", seq_lens=64).options.timing.fresh_inputs is False
    with pytest.raises(ValueError, match="--fresh-inputs"):
        TimingConfig(mode="ncu", fresh_inputs=True)
    assert dataclasses.replace(TimingConfig(), fresh_inputs=True, mode="graph").fresh_inputs


def test_a_failed_fresh_check_becomes_the_verdict_of_a_case_that_had_passed():
    inputs = make_inputs(SPEC, seed=0)
    backend = SeedOf()
    fresh = FreshInputs(SPEC, backend, inputs, backend.prepare(SPEC, inputs), seed=0)
    fresh.rotation()()  # the last call: set 0

    def checker(spec, checked, outputs, backend):
        if checked is inputs:
            return {"verdict": "fail", "reason": "out max_abs 1 > 1e-6", "tensors": {"out": {"max_abs": 1.0}}}
        return {"verdict": "pass"}
    passed = fresh.check(checker, {"verdict": "pass", "tensors": {"out": {"max_abs": 0.0}}})
    assert passed["verdict"] == "fail" and passed["tensors"] == {"out": {"max_abs": 1.0}}
    assert passed["reason"] == "fresh inputs, the last timed call (input set 0): out max_abs 1 > 1e-6"
    assert passed["fresh_inputs"]["last_call"] == {"verdict": "fail", "reason": "out max_abs 1 > 1e-6", "set": 0}
    failed = fresh.check(checker, {"verdict": "fail", "reason": "the first call"})
    assert failed["reason"] == "the first call" and failed["fresh_inputs"]["last_call"]["verdict"] == "fail"


@pytest.mark.parametrize("op_spec, base", [
    ("sparse-mla", "attnbench.sparse.backends:SparseTorch"),
    ("indexer", "attnbench.sparse.indexer_op:IndexerTorch"),
    ("recurrence", "attnbench.linear.backends:TorchChunked"),
])
def test_fresh_inputs_run_every_operator_and_catch_its_caching_kernel(op_spec, base):
    import importlib

    from attnbench.linear.spec import RecurrenceSpec
    from attnbench.sparse.indexer_op import IndexerSpec
    from attnbench.sparse.spec import SparseSpec
    module, cls = base.split(":")
    base_cls = getattr(importlib.import_module(module), cls)
    cached = _address_cached(base_cls)
    spec = {"sparse-mla": SparseSpec(batch=1, s_q=4, s_kv=40, heads=4, topk=16, indices="random", dtype="fp32"),
            "indexer": IndexerSpec(s_q=16, s_kv=64, heads=2, dim=16, topk=8),
            "recurrence": RecurrenceSpec(kind="gdn", batch=1, seqlens=(32,), heads_qk=1, heads_v=2, d_k=16,
                                         dtype="fp32")}[op_spec]
    registry.register(cached.name, cached)
    try:
        same = run(spec, [base_cls.name, cached.name], fresh=False)
        assert all(r.status == "ok" for r in same.values())  # the same inputs call after call: the cache passes
        cached.cache.clear()
        fresh = run(spec, [base_cls.name, cached.name], fresh=True)
    finally:
        registry.unregister(cached.name)
    right, wrong = fresh[base_cls.name], fresh[cached.name]
    assert right.status == "ok", right.reason
    assert right.accuracy["fresh_inputs"]["new_values"]["verdict"] == "pass"
    assert wrong.status == "mismatch" and "fresh inputs" in wrong.reason, (wrong.status, wrong.reason)


def test_graph_copies_of_another_operators_inputs_have_storage_of_their_own():
    from attnbench import operators
    from attnbench.sparse.spec import SparseSpec
    from attnbench.timing.graphs import clone_inputs, tensor_bytes
    spec = SparseSpec(batch=1, s_q=4, s_kv=40, heads=4, topk=16, indices="random", dtype="fp32")
    inputs = operators.of(spec).make_inputs(spec, "cpu", 0, None)
    copy = clone_inputs(inputs)

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x]
        if dataclasses.is_dataclass(x):
            return [t for f in dataclasses.fields(x) for t in tensors(getattr(x, f.name))]
        return []
    old, new = tensors(inputs), tensors(copy)
    assert len(old) == len(new) >= 4  # q, kv, dout and the selection's index lists
    assert all(a.data_ptr() != b.data_ptr() and torch.equal(a, b) for a, b in zip(old, new))
    assert tensor_bytes(inputs) == tensor_bytes(copy) == sum(t.untyped_storage().nbytes() for t in
                                                             {t.untyped_storage().data_ptr(): t for t in old}.values())

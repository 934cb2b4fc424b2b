"""GPU checks of timing that a kernel cannot game: a kernel whose closure enqueues its matmuls on a side
stream without making the current stream wait is marked (timing/streams.py), one that joins its stream back
is not; a kernel caching its output by its input's address fails with --fresh-inputs in events and graph
mode (timing/fresh.py). Self-contained (its backends are defined here). Run on an H100/H200:
``PYTHONPATH=src python3 -m pytest -q -m gpu tests/gpu/test_off_stream_gpu.py``."""

import pytest
import torch

from attnbench.accuracy.check import AccuracyChecker
from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig, streams

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_exclusive]  # device-wide synchronisations compared with events

# 4 x 2k x 2k x 128 x 16 heads: about 70 GFLOP of matmuls a call, well over a millisecond of plain PyTorch
SPEC = AttnSpec(batch=4, seqlens_q=(2048,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")


def _attention(q, k, v, scale):
    """softmax(Q K^T scale) V for (B, S, H, D) inputs, in matmuls (no causal mask)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    p = torch.softmax(torch.matmul(q * scale, k.transpose(-2, -1)).float(), dim=-1).to(v.dtype)
    return torch.matmul(p, v).transpose(1, 2)


class SideStream(Backend):
    """Runs the attention's matmuls on a stream of its own and returns without the current stream waiting."""

    name = "test-side-stream"
    capabilities = Capabilities(dtypes=("bf16", "fp16"), devices=("cuda",), backward=False, causal=False)
    join = False

    def prepare(self, spec, inputs):
        side = torch.cuda.Stream(inputs.q.device)
        side.wait_stream(torch.cuda.current_stream(inputs.q.device))  # the inputs are ready before it starts

        def call():
            with torch.cuda.stream(side):
                out = _attention(inputs.q, inputs.k, inputs.v, spec.softmax_scale)
            if self.join:
                torch.cuda.current_stream(inputs.q.device).wait_stream(side)
            return Outputs(out=out)
        return Prepared(fn=call, info={"kernel": "matmuls on a side stream"})


class JoinedStream(SideStream):
    """The same on a side stream, and the current stream waits for it: a well-behaved kernel."""

    name = "test-joined-stream"
    join = True


class AddressCache(Backend):
    """The attention in matmuls behind a cache keyed by ``q.data_ptr()`` that outlives a preparation."""

    name = "test-gpu-address-cache"
    capabilities = Capabilities(dtypes=("bf16", "fp16"), devices=("cuda",), backward=False, causal=False)
    cache: dict = {}

    def prepare(self, spec, inputs):
        def call():
            key = inputs.q.data_ptr()
            if key not in AddressCache.cache:
                AddressCache.cache[key] = Outputs(out=_attention(inputs.q, inputs.k, inputs.v, spec.softmax_scale))
            return AddressCache.cache[key]
        return Prepared(fn=call)


@pytest.fixture(autouse=True)
def _backends():
    for cls in (SideStream, JoinedStream, AddressCache):
        registry.register(cls.name, cls)
    AddressCache.cache.clear()
    yield
    AddressCache.cache.clear()
    for cls in (SideStream, JoinedStream, AddressCache):
        registry.unregister(cls.name)


def _run(names, spec=SPEC, **timing):
    config = TimingConfig(warmup=2, repeat=timing.pop("repeat", 10), **timing)
    runner = Runner(RunOptions(device="cuda", backends=tuple(names), timing=config), run_id="t", env_id=None,
                    sink=lambda r: None, checker=AccuracyChecker())
    return {r.backend: r for r in runner.run([spec])}


def test_the_check_sees_matmuls_left_on_a_side_stream():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))

    def on_side(join):
        def fn():
            with torch.cuda.stream(side):
                for _ in range(4):
                    a @ a
            if join:
                torch.cuda.current_stream(device).wait_stream(side)
        return fn

    def current():
        for _ in range(4):
            a @ a

    for fn in (current, on_side(join=True), on_side(join=False)):  # warm up cuBLAS on both streams
        fn()
    torch.cuda.synchronize(device)
    left = streams.check(on_side(join=False), device, median_ms=0.01)
    assert left["left_running"] is True, left
    assert left["outside_ms"] > left["stream_ms"], left
    for fn in (current, on_side(join=True)):
        fine = streams.check(fn, device, median_ms=0.5)
        assert fine["left_running"] is False, fine


def test_a_kernel_on_a_side_stream_is_implausible_and_a_joined_one_is_not():
    recs = _run([SideStream.name, JoinedStream.name])
    side, joined = recs[SideStream.name], recs[JoinedStream.name]
    # its outputs are right (the runner synchronizes the device before checking them); its time is not
    assert side.accuracy["verdict"] == "pass", side.accuracy.get("reason")
    assert side.status == "implausible" and "another stream" in side.reason, side.reason
    assert side.info["off_stream"]["left_running"] is True and side.tflops is None
    assert joined.status == "ok", joined.reason
    assert joined.info["off_stream"]["left_running"] is False


def test_a_kernel_on_a_side_stream_is_marked_in_graph_mode_too():
    # capture may refuse the side stream (then events time it) or capture nothing of it: marked either way
    side = _run([SideStream.name], mode="graph")[SideStream.name]
    assert side.status == "implausible" and "another stream" in side.reason, side.reason


@pytest.mark.parametrize("mode", ["events", "graph"])
def test_a_kernel_caching_by_address_fails_with_fresh_inputs(mode):
    small = SPEC.replace(batch=1, seqlens_q=(512,), heads_q=4, heads_kv=4)
    same = _run([AddressCache.name], small, mode=mode)[AddressCache.name]
    assert same.accuracy["verdict"] == "pass" and same.status != "mismatch"
    AddressCache.cache.clear()
    fresh = _run([AddressCache.name], small, mode=mode, fresh_inputs=True)[AddressCache.name]
    assert fresh.status == "mismatch", fresh.reason
    assert fresh.accuracy["fresh_inputs"]["new_values"]["verdict"] == "fail"


@pytest.mark.parametrize("mode", ["events", "graph"])
def test_correct_kernels_pass_with_fresh_inputs(mode):
    spec = AttnSpec(batch=2, seqlens_q=(1024,), heads_q=8, head_dim=128, dtype="bf16", causal=True,
                    pass_="fwd_bwd")
    for name, record in _run(["sdpa-flash", "naive"], spec, mode=mode, fresh_inputs=True).items():
        assert record.status == "ok", (name, record.reason)
        checks = record.accuracy["fresh_inputs"]
        assert checks["last_call"]["verdict"] == "pass" and checks["new_values"]["verdict"] == "pass", checks
        assert record.info["off_stream"]["left_running"] is False
        if mode == "graph" and "graph_fallback" not in record.info:
            assert record.info["fresh_inputs"]["sets"] == record.info["graph_copies"] >= 2

"""Memory guard: the estimate, the message, and the runner skipping (not running) what cannot fit."""

import math

import pytest
import torch

from attnbench import memory
from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared
from attnbench.plausibility import Ceilings
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

GiB = 1 << 30


def fake_cuda(monkeypatch, free: int, reserved: int = 0, allocated: int = 0):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_naive_scores_dominate_and_scale_with_pass():
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
    naive = registry.get("naive")
    est = memory.estimate(spec, naive)
    scores = 2 * 16 * 4096 * 4096 * 2  # B*H*Sq*Sk*bytes
    assert est.workspace == 2 * scores  # scores and probabilities live together
    assert est.inputs == 4 * 2 * 4096 * 16 * 128 * 2  # q, k, v, dout
    assert est.grads == 0
    bwd = memory.estimate(spec.replace(pass_="fwd_bwd"), naive)
    assert bwd.workspace == 3 * scores and bwd.grads == 3 * 2 * 4096 * 16 * 128 * 2
    math = memory.estimate(spec, registry.get("sdpa-math"))  # bf16 computed in fp32: 3 fp32 copies
    assert math.workspace == 3 * 2 * scores
    fused = memory.estimate(spec, registry.get("sdpa-flash"))
    assert fused.workspace == 0 and fused.total < est.total / 5


def test_varlen_forward_needs_only_the_largest_sequence():
    spec = AttnSpec(seqlens_q=(100, 300, 17), heads_q=4, head_dim=8, dtype="fp32", pass_="fwd")
    assert memory.score_bytes(spec) == 4 * 300 * 300 * 4
    assert memory.score_bytes(spec.replace(pass_="bwd")) == 3 * 4 * (100**2 + 300**2 + 17**2) * 4


def test_declared_workspace_wins():
    class Declares(Backend):
        name = "declares"

        def workspace_bytes(self, spec):
            return 12345
    spec = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=8)
    assert memory.estimate(spec, Declares()).workspace == 12345


def test_guard_message_and_cached_memory_counts_as_free(monkeypatch):
    spec = AttnSpec(batch=8, seqlens_q=(32768,), heads_q=32, head_dim=128, dtype="bf16", pass_="fwd")
    naive = registry.get("naive")
    fake_cuda(monkeypatch, free=22 * GiB)
    reason = memory.guard(spec, naive, "cuda")
    need = memory.estimate(spec, naive).beyond_inputs
    assert reason == f"needs {need / GiB:.1f} GiB, 22.0 GiB free (estimated; not run)"
    assert memory.guard(spec, registry.get("sdpa-flash"), "cuda") is None
    # memory held by the caching allocator but unused is free for the case
    fake_cuda(monkeypatch, free=1 * GiB, reserved=need + GiB, allocated=GiB)
    assert memory.guard(spec, naive, "cuda") is None
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 22 * GiB)  # the CPU: host memory
    assert memory.guard(spec, naive, "cpu") == f"needs {need / GiB:.1f} GiB, 22.0 GiB free (estimated; not run)"
    monkeypatch.setattr(memory, "host_available_bytes", lambda: None)
    assert memory.guard(spec, naive, "cpu") is None  # unknown: never skips
    assert memory.format_bytes(34.1 * GiB) == "34.1 GiB" and memory.format_bytes(3 << 20) == "3.0 MiB"


class Records(Backend):
    name = "test-records-prepare"
    capabilities = Capabilities()
    prepared: list = []

    def prepare(self, spec, inputs):
        self.prepared.append(spec)
        return Prepared(fn=lambda: Outputs(out=inputs.q.clone()))


@pytest.mark.parametrize("free, inputs_fit", [(10 << 20, True), (10, False)])
def test_runner_skips_cases_that_cannot_fit(monkeypatch, free, inputs_fit):
    registry.register(Records.name, Records)
    Records.prepared.clear()
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    specs = [AttnSpec(seqlens_q=(s,), heads_q=2, head_dim=8, dtype="fp32") for s in (16, 2048)]
    out = []
    unbounded = Ceilings(tflops=math.inf, gbps=math.inf, source="test")  # Records' clone is no attention
    runner = Runner(RunOptions(device="cpu", backends=("naive", Records.name), timing=TimingConfig(warmup=0, repeat=1),
                               ceilings=unbounded), run_id="r", env_id=None, sink=out.append)
    runner.run(specs)
    by = {(r.backend, r.spec.seqlens_q[0]): r for r in out}
    big = by[("naive", 2048)]  # scores 2*2048*2048*4 = 32 MiB > 10 MiB
    assert big.status == "oom" and "needs " in big.reason and "free" in big.reason
    if inputs_fit:
        assert by[("naive", 16)].status == "ok" and by[(Records.name, 2048)].status == "ok"
        assert [s.seqlens_q[0] for s in Records.prepared] == [16, 2048]
    else:  # not even the inputs fit: nothing is prepared, every case says so
        assert all(r.status == "oom" and r.reason.startswith("inputs: needs") for r in out)
        assert Records.prepared == []


def test_inputs_that_cannot_be_allocated_do_not_end_the_sweep(monkeypatch):
    import attnbench.inputs as inputs_mod  # what the attention operator calls (attnbench.operators)
    real = inputs_mod.make_inputs

    def flaky(spec, device, seed, dist=None):
        if spec.seqlens_q[0] == 33:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 99 GiB")
        return real(spec, device, seed, dist)
    monkeypatch.setattr(inputs_mod, "make_inputs", flaky)
    out = []
    specs = [AttnSpec(seqlens_q=(s,), heads_q=2, head_dim=8, dtype="fp32") for s in (17, 33, 65)]
    Runner(RunOptions(device="cpu", backends=("naive",), timing=TimingConfig(warmup=0, repeat=1)), run_id="r",
           env_id=None, sink=out.append).run(specs)
    assert [r.status for r in out] == ["ok", "oom", "ok"]
    assert "99 GiB" in out[1].reason


def test_a_cpu_case_whose_scores_cannot_fit_in_host_memory_is_refused_with_the_numbers(tmp_path):
    """B=8, S=32k, H=32 bf16 naive needs 2 x 512 GiB of scores: no machine running the tests has that free."""
    from reliability_helpers import attnbench
    res = attnbench("run", "--device", "cpu", "--backends", "naive",
                    "--batch-size", "8", "--seq-lens", "32k", "--q-heads", "32", "--head-size", "16",
                    "--pass", "fwd", "--no-causal", "--dtype", "bf16", "--db", str(tmp_path / "r.db"),
                    "--output", str(tmp_path / "r.json"))
    assert res.returncode == 2, res.stderr  # nothing asked for could run: not a 0, and the one line says why
    assert res.stderr.count("\n") == 1 and "case needs 102" in res.stderr and "GiB free" in res.stderr, res.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.db").exists()  # refused before it started


def test_an_oom_inside_an_sdpa_kernel_probe_is_an_oom_record_not_unsupported(monkeypatch):
    """SDPA's prepare probes its kernel; an out-of-memory there (sdpa-math at 32k on an H200) is an oom."""
    import attnbench.backends.sdpa as sdpa_mod

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB")
    monkeypatch.setattr(sdpa_mod.F, "scaled_dot_product_attention", no_memory)
    out = []
    Runner(RunOptions(device="cpu", backends=("sdpa-math",), timing=TimingConfig(warmup=0, repeat=1)), run_id="r",
           env_id=None, sink=out.append).run([AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32")])
    assert [(r.status, r.reason) for r in out] == [("oom", "CUDA out of memory. Tried to allocate 128.00 GiB")]


def test_a_shared_prefix_is_counted_once_in_the_inputs():
    # the cascade batches (128 and 256 decodes over one 32k prefix) were refused as needing 65 and 130 GiB of
    # inputs on an 80 GB GPU: the inputs' estimate wrote the prefix out for every request, the inputs store it once
    from attnbench.inputs import make_inputs
    spec = AttnSpec(seqlens_q=(1,) * 8, seqlens_k=(80,) * 8, heads_q=4, heads_kv=2, head_dim=16, dtype="bf16",
                    causal=True, shared_prefix=64)
    x = make_inputs(spec, "cpu", seed=0)
    held = sum(t.numel() * t.element_size() for t in (x.q, x.k, x.v, x.dout, x.prefix_k, x.prefix_v))
    assert memory.estimate(spec).inputs == held
    written_out = 8 * 80 * 2 * 16 * 2 * 2  # every request's 80 keys and values, for a kernel that takes no prefix
    assert memory.estimate(spec, registry.get("sdpa-math")).inputs == held
    assert memory.estimate(spec, registry.get("sdpa-math")).copies == written_out  # made in prepare
    assert memory.estimate(spec, registry.get("flex")).inputs == held

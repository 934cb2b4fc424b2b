"""Memory guard on a real device: an impossible case is skipped with the estimate, a fitting one runs."""

import pytest
import torch

from attnbench import memory
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig


@pytest.mark.gpu
def test_guard_skips_what_cannot_fit_and_runs_what_can():
    free = memory.available_bytes("cuda")
    assert free is not None and 0 < free <= torch.cuda.get_device_properties(0).total_memory
    huge = AttnSpec(batch=4, seqlens_q=(131072,), heads_q=32, head_dim=128, dtype="bf16", pass_="fwd")
    small = AttnSpec(batch=2, seqlens_q=(1024,), heads_q=16, head_dim=64, dtype="bf16", pass_="fwd")
    out = []
    runner = Runner(RunOptions(device="cuda", backends=("naive",), timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="gpu", env_id=None, sink=out.append)
    runner.run([huge, small])
    assert out[0].status == "oom" and "GiB free (estimated; not run)" in out[0].reason, out[0].reason
    assert out[1].status == "ok" and out[1].peak_mem_bytes > 0
    # the estimate of the small case is a lower bound of what it really used beyond its inputs
    assert memory.estimate(small, runner.backends[0]).beyond_inputs <= out[1].peak_mem_bytes * 1.5


@pytest.mark.gpu
def test_peak_memory_is_what_the_call_needs_above_what_it_is_handed():
    from attnbench.backends import registry
    from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared

    mib = 1 << 20

    class HoldsAndNeeds(Backend):
        """prepare keeps 64 MiB; each call needs 16 MiB of scratch plus its small output."""

        name = "test-holds-64-needs-16"
        capabilities = Capabilities(devices=("cuda",))

        def prepare(self, spec, inputs):
            held = torch.empty(64 * mib, dtype=torch.uint8, device="cuda")

            def call():
                scratch = torch.empty(16 * mib, dtype=torch.uint8, device="cuda")
                scratch.fill_(1)
                return Outputs(out=inputs.q.clone() + held[:1].float().sum() * 0)
            return Prepared(fn=call)

    registry.register(HoldsAndNeeds.name, HoldsAndNeeds)
    spec = AttnSpec(batch=1, seqlens_q=(256,), heads_q=2, head_dim=64, dtype="bf16", pass_="fwd")
    out = []
    Runner(RunOptions(device="cuda", backends=(HoldsAndNeeds.name,), timing=TimingConfig(warmup=0, repeat=3)),
           run_id="gpu", env_id=None, sink=out.append).run([spec])
    rec = out[0]
    assert rec.info["prepare_mem_bytes"] >= 64 * mib
    assert 16 * mib <= rec.peak_mem_bytes < 20 * mib, rec.peak_mem_bytes


@pytest.mark.gpu
def test_a_packed_copy_made_in_prepare_does_not_count_as_the_kernels_memory():
    from attnbench.backends import registry
    if not {"fa2", "fa2-qkvpacked"} <= set(registry.available("cuda")):
        pytest.skip("flash-attn 2 not installed")
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
    out = []
    Runner(RunOptions(device="cuda", backends=("fa2", "fa2-qkvpacked"), timing=TimingConfig(warmup=1, repeat=3)),
           run_id="gpu", env_id=None, sink=out.append).run([spec])
    fa2, packed = out
    assert packed.info["prepare_mem_bytes"] >= 3 * 2 * 4096 * 16 * 128 * 2  # the stacked q, k, v
    assert packed.peak_mem_bytes <= 1.1 * fa2.peak_mem_bytes, (packed.peak_mem_bytes, fa2.peak_mem_bytes)

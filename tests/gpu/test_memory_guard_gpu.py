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

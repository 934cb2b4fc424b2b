"""On a GPU: the fp32 blocked reference against fp64 on the CPU, SDPA kernels pass the verdict in bf16,
poisoning turns unwritten output elements into NaN, and TF32 is really off inside the reference."""

import pytest
import torch

from attnbench.accuracy.check import AccuracyChecker
from attnbench.accuracy.reference import BlockSizes, exact_fp32_matmul, reference_attention
from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared
from attnbench.inputs import AttnInputs, make_inputs
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

pytestmark = pytest.mark.gpu
FAST = TimingConfig(warmup=0, repeat=2)
SDPA = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")


def to_cpu(inputs: AttnInputs) -> AttnInputs:
    moved = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(inputs).items()}
    return AttnInputs(**moved)


@pytest.mark.parametrize("spec", [
    AttnSpec(batch=2, seqlens_q=(1000,), seqlens_k=(1537,), heads_q=8, heads_kv=2, head_dim=64, dtype="bf16",
             causal=True, pass_="fwd_bwd"),
    AttnSpec(batch=1, seqlens_q=(577, 2048, 33), heads_q=4, head_dim=128, dtype="fp16", window=(100, 0),
             pass_="fwd_bwd"),
], ids=["dense-gqa-causal", "varlen-window"])
def test_cuda_fp32_reference_matches_cpu_fp64(spec):
    inputs = make_inputs(spec, "cuda", seed=7)
    gpu = reference_attention(spec, inputs, blocks=BlockSizes(q=256, k=512))
    cpu = reference_attention(spec, to_cpu(inputs), dtype=torch.float64)
    assert gpu.out.dtype == torch.float32 and gpu.out.is_cuda
    for name, want in cpu.tensors().items():
        got = getattr(gpu, name).cpu().double()
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(got), finite), name
        scale = want[finite].abs().max()
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=2e-5 * float(scale), msg=name)


def test_tf32_is_off_inside_the_reference_and_restored_after():
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    exact = (a.double() @ b.double()).float()
    torch.set_float32_matmul_precision("high")  # the caller allows TF32
    try:
        with exact_fp32_matmul():
            err_inside = float((a @ b - exact).abs().max())
        err_outside = float((a @ b - exact).abs().max())
    finally:
        torch.set_float32_matmul_precision("highest")
    assert err_inside < 1e-3
    if torch.cuda.get_device_capability() >= (8, 0):
        assert err_outside > 10 * err_inside  # TF32 is back on after the block


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_kernels_pass_in_bf16(causal):
    specs = [AttnSpec(batch=2, seqlens_q=(s,), heads_q=16, heads_kv=kv, head_dim=128, dtype="bf16", causal=causal,
                      pass_="fwd_bwd") for s, kv in ((1024, 16), (4093, 4))]
    runner = Runner(RunOptions(device="cuda", backends=("naive", *SDPA), timing=FAST), run_id="g", env_id=None,
                    sink=lambda r: None, checker=AccuracyChecker())
    records = runner.run(specs)
    ran = [r for r in records if r.status != "unsupported"]
    assert {r.backend for r in ran} >= {"naive", "sdpa-math", "sdpa-flash"}
    for r in ran:
        assert r.status == "ok", (r.backend, r.spec.label(), r.reason)
        assert r.accuracy["verdict"] == "pass" and r.accuracy["reference"].startswith("float32 cuda")


class LeavesRowsUnwritten(Backend):
    """Allocates its output with torch.empty and never writes the last 5 rows (a real kernel bug pattern)."""

    name = "test-gpu-unwritten"
    capabilities = Capabilities(backward=False)

    def prepare(self, spec, inputs):
        def fn():
            out = torch.empty(inputs.q.shape[:-1] + (spec.head_dim_v,), dtype=inputs.q.dtype, device=inputs.q.device)
            q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
            good = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            out[:, :-5] = good[:, :-5]
            return Outputs(out=out)
        return Prepared(fn=fn, info={"kernel": "broken"})


def test_poisoning_turns_unwritten_rows_into_nan_status():
    registry.register(LeavesRowsUnwritten.name, LeavesRowsUnwritten)
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16")
    runner = Runner(RunOptions(device="cuda", backends=(LeavesRowsUnwritten.name,), timing=FAST), run_id="p",
                    env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    rec = runner.run([spec])[0]
    assert rec.status == "nan" and "out" in rec.reason and rec.accuracy["verdict"] == "fail"
    # The poison block (>= 256 MiB, here about 1 GiB) is not counted in the case's peak memory.
    assert rec.peak_mem_bytes is not None and rec.peak_mem_bytes < 256 * 2 ** 20


def test_fp32_cases_use_an_fp64_reference_and_sdpa_passes():
    spec = AttnSpec(batch=1, seqlens_q=(777,), heads_q=8, heads_kv=2, head_dim=64, dtype="fp32", causal=True,
                    pass_="fwd_bwd")
    runner = Runner(RunOptions(device="cuda", backends=("naive", "sdpa-math", "sdpa-efficient"), timing=FAST),
                    run_id="f", env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    records = [r for r in runner.run([spec]) if r.status != "unsupported"]
    assert records
    for r in records:
        assert r.status == "ok", (r.backend, r.reason)
        assert r.accuracy["reference"].startswith("float64 cuda")

"""GPU checks of the timing modes: cold L2 is really cold, profiler mode names the kernel that ran,
graph mode captures (or falls back with a reason), ncu agrees when installed. Run on an H100/H200:
``PYTHONPATH=src python3 -m pytest -q -m gpu tests/gpu/test_timing_gpu.py``."""

import math
import shutil
import statistics

import pytest
import torch

from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig
from attnbench.timing.events import l2_bytes, time_events

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_exclusive]  # times compared: the GPU to itself under -n N
SMALL = AttnSpec(batch=1, seqlens_q=(1024,), heads_q=8, head_dim=64, dtype="bf16", pass_="fwd")


def _run(backend: str, spec: AttnSpec, **timing):
    cfg = TimingConfig(warmup=3, repeat=timing.pop("repeat", 10), min_time_ms=timing.pop("min_time_ms", 0.0), **timing)
    runner = Runner(RunOptions(device="cuda", backends=(backend,), timing=cfg), run_id="t", env_id=None,
                    sink=lambda r: None)
    (record,) = runner.run([spec])
    return record


def test_l2_flush_makes_a_bandwidth_bound_kernel_slower():
    device = torch.device("cuda")
    x = torch.randn(l2_bytes(device) // 4 // 4, device=device)  # a quarter of L2: stays resident when warm
    def fn():
        return x.mul_(1.0)
    # The fastest call of each: under pytest -n 8 other tests share the GPU, and a median taken while they
    # run can make the warm calls the slower ones (seen: warm 22 us, cold 14 us); every cold call still
    # reads from device memory, so its fastest stays cold.
    warm = min(time_events(fn, TimingConfig(warmup=10, repeat=200, cold_l2=False, min_time_ms=0.0), device))
    cold = min(time_events(fn, TimingConfig(warmup=10, repeat=200, cold_l2=True, min_time_ms=0.0), device))
    assert cold > 1.15 * warm, (cold, warm)


def _names(record):
    assert record.status == "ok", record.reason
    names = [n.lower() for n in record.info["kernels"]]
    assert names and record.info["kernels_per_call"] >= 1
    return names


def test_profiler_mode_names_the_flash_kernel():
    names = _names(_run("sdpa-flash", SMALL, mode="profiler"))
    assert any("flash" in n for n in names), names
    assert not any("cudnn" in n for n in names), names


def test_profiler_mode_names_the_cudnn_kernel():
    record = _run("sdpa-cudnn", SMALL, mode="profiler")
    if record.status == "unsupported":
        pytest.skip(record.reason)
    names = _names(record)
    # cuDNN's generated SDPA kernels are named like cudnn_generated_..._sdpa_sm90_flash_fprop_...
    assert any(tag in n for n in names for tag in ("cudnn", "fmha", "sm90", "sm100", "sdpa")), names
    assert not any("pytorch_flash" in n for n in names), names


def test_profiler_kernel_time_close_to_events():
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
    prof = _run("sdpa-flash", spec, mode="profiler", repeat=20)
    events = _run("sdpa-flash", spec, mode="events", repeat=20)
    assert abs(prof.median_ms - events.median_ms) / events.median_ms < 0.10, (prof.median_ms, events.median_ms)


def test_graph_mode_rotates_cold_copies():
    record = _run("sdpa-flash", SMALL, mode="graph", repeat=20)
    assert record.status == "ok", record.reason
    info = record.info
    assert "graph_fallback" not in info, info.get("graph_fallback")
    assert info["graph_calls"] >= info["graph_copies"] >= 2 and info["graph_cold"] is True
    events = _run("sdpa-flash", SMALL, mode="events", repeat=50)
    # no launch gaps in a graph: not slower than per-call events beyond noise
    assert record.median_ms < 1.10 * events.median_ms, (record.median_ms, events.median_ms)


class _HostSync(Backend):
    """A kernel wrapper that reads a value back to the host on every call: not capturable in a graph."""

    name = "test-host-sync"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        def fn():
            out = inputs.q * 2
            float(out.sum())  # host synchronisation inside the timed call
            return Outputs(out=out)
        return Prepared(fn=fn)


def test_graph_mode_falls_back_with_a_reason_when_capture_fails():
    registry.register(_HostSync.name, _HostSync)
    spec = AttnSpec(batch=1, seqlens_q=(256,), heads_q=2, head_dim=32, dtype="fp16", pass_="fwd")
    record = _run(_HostSync.name, spec, mode="graph")
    assert record.status == "ok", record.reason
    assert "capture failed" in record.info.get("graph_fallback", ""), record.info
    assert record.n >= 10 and record.median_ms > 0
    # the aborted capture must not leave the RNG in capture mode for whatever runs next
    assert torch.randn(1024, device="cuda").isfinite().all()


def test_clock_state_recorded_when_readable():
    record = _run("sdpa-flash", SMALL, mode="events")
    if "gpu_state" not in record.info:
        pytest.skip("neither NVML nor nvidia-smi readable here")
    assert record.info["gpu_state"]["start"].get("sm_clock_mhz") and "median_ci95_ms" in record.info


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu not installed")
def test_ncu_profiler_mode_matches_events():
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
    ncu = _run("sdpa-flash", spec, mode="ncu", repeat=5)
    assert ncu.status == "ok", ncu.reason
    assert ncu.n == 5 and any("flash" in n.lower() for n in ncu.info["kernels"])
    events = _run("sdpa-flash", spec, mode="events", repeat=20)
    assert abs(ncu.median_ms - events.median_ms) / ncu.median_ms < 0.10, (ncu.median_ms, events.median_ms)


@pytest.mark.parametrize("tool", ["nsys", "ncu"])
def test_a_profiler_times_the_whole_backward_pass(tool):
    """fwd_bwd under a profiler is the forward and the backward kernels, as events time it: autograd launches the
    backward from a thread of its own, and ncu's NVTX filter once kept only the forward (a quarter of the time)."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    spec = AttnSpec(batch=2, seqlens_q=(2048,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd_bwd")
    profiled = _run("sdpa-flash", spec, mode=tool, repeat=5)
    assert profiled.status == "ok", profiled.reason
    events = _run("sdpa-flash", spec, mode="events", repeat=20)
    assert abs(profiled.median_ms / events.median_ms - 1) < 0.15, (profiled.median_ms, events.median_ms)
    assert any("bwd" in n.lower() or "backward" in n.lower() for n in profiled.info["kernels"]), \
        profiled.info["kernels"]


@pytest.mark.parametrize("tool", ["nsys", "ncu"])
def test_a_profiled_sweep_shares_one_process_per_backend_and_keeps_each_cases_time(tool):
    """Three cases of one backend in one profiler process give each its own time, as three processes do."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    specs = [AttnSpec(batch=2, seqlens_q=(s,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
             for s in (1024, 2048, 4096)]

    def sweep(batch):
        cfg = TimingConfig(warmup=3, repeat=5, min_time_ms=0.0, mode=tool, profiler_batch=batch)
        return Runner(RunOptions(device="cuda", backends=("sdpa-flash",), timing=cfg), run_id="t", env_id=None,
                      sink=lambda r: None).run(specs)
    shared, alone = sweep(32), sweep(1)
    assert [r.status for r in shared + alone] == ["ok"] * 6, [r.reason for r in shared + alone]
    assert {r.info["profiler_session"]["cases"] for r in shared} == {3}
    assert {r.info["profiler_session"]["cases"] for r in alone} == {1}
    for a, b in zip(shared, alone):
        assert abs(a.median_ms / b.median_ms - 1) < 0.05, (a.spec.label(), a.median_ms, b.median_ms)
    assert shared[0].median_ms < shared[1].median_ms < shared[2].median_ms  # each case its own block


def test_an_nsys_sweep_of_two_backends_shares_one_process_and_keeps_each_cases_time():
    """nsys takes the next cases of any backend into its session: four cases of two kernels in one process give
    each case its own backend's kernels and time, as four processes do."""
    if shutil.which("nsys") is None:
        pytest.skip("nsys not installed")
    specs = [AttnSpec(batch=2, seqlens_q=(s,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
             for s in (1024, 4096)]

    def sweep(batch):
        cfg = TimingConfig(warmup=3, repeat=5, min_time_ms=0.0, mode="nsys", profiler_batch=batch)
        return Runner(RunOptions(device="cuda", backends=("sdpa-flash", "sdpa-cudnn"), timing=cfg), run_id="t",
                      env_id=None, sink=lambda r: None).run(specs)
    shared, alone = sweep(32), sweep(1)
    assert [r.status for r in shared + alone] == ["ok"] * 8, [r.reason for r in shared + alone]
    assert {r.info["profiler_session"]["cases"] for r in shared} == {4}
    for a, b in zip(shared, alone):
        assert (a.backend, a.spec) == (b.backend, b.spec)
        assert a.info["kernels"] == b.info["kernels"], (a.backend, a.info["kernels"], b.info["kernels"])
        assert abs(a.median_ms / b.median_ms - 1) < 0.05, (a.backend, a.spec.label(), a.median_ms, b.median_ms)
    flash, cudnn = (next(r for r in shared if r.backend == name and r.spec == specs[0])
                    for name in ("sdpa-flash", "sdpa-cudnn"))
    assert flash.info["kernels"] != cudnn.info["kernels"]


def test_calibrate_measures_plausible_peaks():
    from attnbench.timing.peaks import calibrate
    got = calibrate("cuda", matmul_n=4096, copy_bytes=512 * 2**20, repeat=10)["measured"]
    assert got["matmul_bf16"] > 50 and got["copy"] > 500, got


def test_host_bound_calls_are_timed_by_their_device_time():
    """A call that spends 0.3 ms on the host to launch a ~20 us kernel: the spin before each chunk
    (shortened by the device time the first samples show) must still cover the host's queueing."""
    import time as _time
    x = torch.randn(1 << 20, device="cuda")

    def kernel():
        return x * 2

    def host_heavy():
        t0 = _time.perf_counter()
        while _time.perf_counter() - t0 < 3e-4:
            pass
        return x * 2
    cfg = TimingConfig(warmup=5, repeat=200, min_time_ms=0.0, ci_target_pct=0)
    fast = statistics.median(time_events(kernel, cfg, torch.device("cuda")))
    slow = statistics.median(time_events(host_heavy, cfg, torch.device("cuda")))
    assert slow < 1.2 * fast + 0.005, (fast, slow)   # not the 0.3 ms of host time


def test_idle_ratio_leaves_the_device_idle_between_calls():
    import time as _time
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    dev = torch.device("cuda")
    a @ a  # cuBLAS set-up out of the comparison
    torch.cuda.synchronize()
    cfg = TimingConfig(warmup=3, repeat=30, min_time_ms=0.0, ci_target_pct=0, idle_ratio=2.0)
    t0 = _time.perf_counter()
    samples = time_events(lambda: a @ a, cfg, dev)
    idle_wall, idle_sum = _time.perf_counter() - t0, sum(samples)
    assert idle_wall * 1e3 > idle_sum * 2.5       # ~3x the measured time: 2x of it idle
    # (no comparison with a busy loop's wall: under -n 8 its host overhead alone reached this one, H100 2026-11-24)


def test_align_is_queued_before_each_start_event():
    """What ``align`` queues (in a job: a wait for the other ranks' devices) runs before each call's start
    event, so it never counts as the call's time: here it sleeps the device ~20 ms before every call."""
    x = torch.randn(1 << 20, device="cuda")
    dev = torch.device("cuda")
    calls = []

    def align():
        calls.append(1)
        torch.cuda._sleep(40_000_000)  # tens of ms at any clock

    cfg = TimingConfig(warmup=2, repeat=20, min_time_ms=0.0, max_time_ms=math.inf, ci_target_pct=0)
    samples = time_events(lambda: x * 2, cfg, dev, align)
    assert len(calls) == len(samples) == 20
    assert max(samples) < 2.0, max(samples)  # the multiply, not the sleep


def test_a_record_says_what_the_gpu_did_across_its_timed_calls():
    """``gpu_state.window`` (with NVML or torch's wrappers installed) holds readings taken inside the timed calls,
    and ``launch`` compares the host's time to issue a call with the device's."""
    from attnbench.timing.clocks import ClockMonitor
    record = _run("sdpa-flash", SMALL, min_time_ms=200.0, max_time_ms=300.0, ci_target_pct=0)
    assert record.status == "ok", record.reason
    launch = record.info["launch"]
    assert launch["host_ms"] > 0 and launch["host_bound"] == (launch["host_ms"] > record.median_ms)
    if ClockMonitor("cuda").reader() is None:
        pytest.skip("no NVML and no torch sensor wrappers: no window")
    window = record.info["gpu_state"]["window"]
    assert window["over"] == "timed calls" and window["samples"] >= 3, window
    clock = window["sm_clock_mhz"]
    assert 100 < clock["min"] <= clock["median"] <= clock["max"] < 5000

"""No impossible time is reported as a speed, and the check covers a call made after the timed ones."""

import json
import sys

import pytest
from reliability_helpers import PLUGINS, attnbench, query

from attnbench import plausibility
from attnbench.plausibility import Ceilings
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

sys.path.insert(0, PLUGINS)
import attnbench_test_backends  # noqa: E402,F401  (registers the test backends)

FAST = TimingConfig(warmup=1, repeat=5)


def run(spec, names, check=True):
    from attnbench.accuracy.check import AccuracyChecker
    runner = Runner(RunOptions(device="cpu", backends=tuple(names), timing=FAST), run_id="t", env_id=None,
                    sink=lambda r: None, checker=AccuracyChecker() if check else None)
    return {r.backend: r for r in runner.run([spec])}


def test_work_moved_into_prepare_is_implausible_not_a_speed():
    spec = AttnSpec(seqlens_q=(2048,), heads_q=8, head_dim=64, dtype="fp32")  # 8.6 GFLOP per call
    recs = run(spec, ["test-cached", "naive"])
    cached = recs["test-cached"]
    assert cached.status == "implausible" and "TFLOP/s is above the device's" in cached.reason
    assert cached.tflops is None and cached.gbps is None and cached.iters_per_s is None
    assert cached.median_ms is not None and cached.accuracy["verdict"] == "pass"  # right numbers, impossible time
    assert recs["naive"].status == "ok" and recs["naive"].tflops > 0


def test_ceilings_and_the_check():
    cpu = plausibility.ceilings("cpu")
    assert cpu.tflops > 0 and "CPU" in cpu.source
    limits = Ceilings(tflops=1000.0, gbps=4000.0, source="test")
    assert plausibility.check(tflops=900, gbps=100, info={}, exact=True, cold_l2=True, limits=limits) is None
    assert "1,100 TFLOP/s" in plausibility.check(tflops=1100, gbps=100, info={}, exact=True, cold_l2=True,
                                                 limits=limits)
    # quantized kernels may reach twice the 16-bit peak; sparse ones are held to the blocks they kept
    assert plausibility.check(tflops=1500, gbps=100, info={}, exact=False, cold_l2=True, limits=limits) is None
    assert plausibility.check(tflops=5000, gbps=100, info={"sparsity": 0.8}, exact=False, cold_l2=True,
                              limits=limits) is None
    assert plausibility.check(tflops=5000, gbps=100, info={"sparsity": 0.5}, exact=False, cold_l2=True,
                              limits=limits) is not None
    # bandwidth: only when every call starts with a cold L2
    assert "GB/s" in plausibility.check(tflops=1, gbps=5000, info={}, exact=True, cold_l2=True, limits=limits)
    assert plausibility.check(tflops=1, gbps=5000, info={}, exact=True, cold_l2=False, limits=limits) is None


def test_a_kernel_wrong_after_its_first_call_fails_the_check():
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, dtype="fp32")
    recs = run(spec, ["test-stale", "naive"])
    stale = recs["test-stale"]
    assert stale.status == "mismatch" and stale.reason.startswith("a call after the timed calls: out")
    assert stale.accuracy["repeat"]["after_timing"] == "fail"
    naive = recs["naive"].accuracy
    assert recs["naive"].status == "ok" and naive["repeat"] == {"deterministic": True, "max_diff": 0.0,
                                                                "after_timing": "pass", "same_as_checked": True}


def test_a_kernel_reusing_its_output_buffer_is_checked_again_after_timing():
    # its first call after the timed ones returns the checked call's buffer, now holding other values:
    # the bits match themselves, so the verdict must come from the reference, not be carried over
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, dtype="fp32")
    stale = run(spec, ["test-stale-inplace"])["test-stale-inplace"]
    assert stale.status == "mismatch" and stale.reason.startswith("a call after the timed calls: out")
    assert "same_as_checked" not in stale.accuracy["repeat"]


def test_same_bits_needs_equal_values_in_memory_of_its_own():
    import torch

    from attnbench.backends.base import Outputs
    from attnbench.runner import same_bits
    x = torch.randn(4, 8)
    assert same_bits(Outputs(out=x.clone()), Outputs(out=x.clone()))
    assert not same_bits(Outputs(out=x), Outputs(out=x))  # one buffer: nothing to compare
    assert not same_bits(Outputs(out=x.clone()), Outputs(out=torch.nextafter(x, x + 1)))  # last bit
    assert not same_bits(Outputs(out=x.clone(), lse=x[:, 0].clone()), Outputs(out=x.clone()))
    assert not same_bits(Outputs(out=x.clone()), Outputs(out=x.double()))


def test_repeated_calls_that_differ_are_reported_not_failed():
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, dtype="fp32")
    jitter = run(spec, ["test-jitter"])["test-jitter"]
    repeat = jitter.accuracy["repeat"]
    assert jitter.status == "ok" and repeat["deterministic"] is False and repeat["differs"] == ["out"]
    assert 0 < repeat["max_diff"] < 1e-6


def test_no_check_means_no_repeat_calls():
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, dtype="fp32")
    assert run(spec, ["naive"], check=False)["naive"].accuracy is None


@pytest.mark.parametrize("flag", [[], ["--no-check"]])
def test_run_exits_1_on_an_implausible_case_and_plot_says_what_it_left_out(tmp_path, flag):
    db = tmp_path / "r.db"
    # two lengths: plot refuses an axis with one value (a figure of single points)
    res = attnbench("run", "--device", "cpu", "--backends", "naive,test-cached", "--seq-lens", "1536", "2048",
                    "--q-heads", "8", "--head-size", "64", "--dtype", "fp32", "--pass", "fwd", "--no-causal",
                    "--warmup", "1", "--repeat", "3", "--quiet", "--db", str(db), *flag)
    assert res.returncode == 1, res.stderr
    assert "cases wrong (implausible test-cached fwd b1 s" in res.stderr.splitlines()[-1]
    assert query(db, "SELECT status, tflops FROM records WHERE backend='test-cached'") == [("implausible", None)] * 2
    out = attnbench("plot", "--db", str(db), "--x", "seq_len", "--y", "tflops", "-o", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert "not drawn: 2 case(s) with an implausible time (test-cached" in out.stdout


def test_verify_defaults_show_the_bugs_a_benchmark_sweep_hides(tmp_path):
    """Four bug classes pass on the aligned shapes of `run`'s default sweep and fail `verify`'s defaults."""
    bugs = [cls.name for cls in attnbench_test_backends.BUG_CLASSES]
    names = ",".join(["test-masked-math", *bugs])
    db = str(tmp_path / "v.db")
    aligned = attnbench("verify", "--device", "cpu", "--backends", names, "--seq-lens", "128", "256",
                        "--q-heads", "4", "--causal", "both", "--db", db, "--json")
    assert aligned.returncode == 0, aligned.stdout[-2000:]
    default = attnbench("verify", "--device", "cpu", "--backends", names, "--db", db, "--json")
    assert default.returncode == 1
    rows = [r for r in json.loads(default.stdout) if r["accuracy"]]
    failed = {r["backend"] for r in rows if r["status"] == "mismatch"}
    assert failed == set(bugs), failed
    assert all(r["status"] == "ok" for r in rows if r["backend"] == "test-masked-math")
    cases = {r["case"] for r in rows}
    assert any("varlen" in c for c in cases) and any("/300" in c for c in cases) and any("h4/2" in c for c in cases)


def test_inputs_with_outliers_are_recorded(tmp_path):
    db = tmp_path / "v.db"
    res = attnbench("verify", "--device", "cpu", "--backends", "naive", "--seq-lens", "100", "--q-heads", "2",
                    "--dtype", "fp16", "--input-scale", "4", "--outliers", "0.001", "--db", str(db))
    assert res.returncode == 0, res.stdout[-2000:]
    infos = [json.loads(r[0]) for r in query(db, "SELECT info FROM records")]
    assert infos and all(i["inputs"] == {"scale": 4.0, "outliers": 0.001} for i in infos)


def test_an_overflow_bug_shows_only_with_large_inputs(tmp_path):
    db = str(tmp_path / "v.db")
    common = ["verify", "--device", "cpu", "--backends", "test-no-max,naive", "--seq-lens", "100", "--q-heads", "2",
              "--dtype", "fp16", "--db", db, "--json"]
    plain = attnbench(*common)
    assert plain.returncode == 0, plain.stdout[-2000:]
    large = attnbench(*common, "--input-scale", "4")
    assert large.returncode == 1
    status = {r["backend"]: r["status"] for r in json.loads(large.stdout)}
    assert status["test-no-max"] in ("nan", "mismatch") and status["naive"] == "ok"


class _TrimmedBuild(attnbench_test_backends.WrapsNaive):
    """A kernel whose build was trimmed: it raises its build's own words for head dims over 64."""

    name = "test-trimmed-build"
    build_limits = ("this build has head dims up to",)

    def wrap(self, inner):
        def call():
            raise RuntimeError("this build has head dims up to 64 only")
        return call


def test_what_a_trimmed_build_lacks_is_unsupported_and_other_errors_stay_errors():
    from attnbench.backends import registry
    registry.register(_TrimmedBuild.name, _TrimmedBuild)
    spec = AttnSpec(seqlens_q=(32,), heads_q=2, head_dim=128, dtype="fp32")
    rec = run(spec, [_TrimmedBuild.name])[_TrimmedBuild.name]
    assert (rec.status, rec.reason) == ("unsupported", "the installed build: this build has head dims up to 64 only")
    assert _TrimmedBuild().build_limit(RuntimeError("CUDA error: an illegal memory access")) is None
    assert registry.get("fa2").build_limit(RuntimeError("this flash-attn build has head dims up to 128 only"))
    assert registry.get("fa3").build_limit(RuntimeError("This flash attention build does not support FP8."))
    assert registry.get("naive").build_limit(RuntimeError("this flash-attn build has head dims up to 128 only")) is None


class _FirstCallOnly(attnbench_test_backends.WrapsNaive):
    """Computes on its first call (the checked one, untimed) and returns that result on every later call."""

    name = "test-first-call-only"

    def wrap(self, inner):
        done = []

        def call():
            if not done:
                done.append(inner())
            return done[0]
        return call


def test_a_kernel_computing_only_on_its_first_call_is_implausible_not_a_speed():
    from attnbench.backends import registry
    registry.register(_FirstCallOnly.name, _FirstCallOnly)
    spec = AttnSpec(seqlens_q=(2048,), heads_q=8, head_dim=64, dtype="fp32")  # 8.6 GFLOP per call
    rec = run(spec, [_FirstCallOnly.name])[_FirstCallOnly.name]
    assert rec.status == "implausible" and "TFLOP/s is above the device's" in rec.reason
    assert rec.accuracy["verdict"] == "pass" and rec.tflops is None  # right numbers, impossible time


class _StateRunsOn(attnbench_test_backends.WrapsNaive):
    """Like a recurrence's decode updating its state in place: each call since the last rewind drifts further
    (the state runs on); ``rewind`` (when it says how) puts the case's state back."""

    name = "test-state-runs-on"
    says_how_to_rewind = True

    def prepare(self, spec, inputs):
        from attnbench.backends.base import Outputs, Prepared
        from attnbench.backends.naive import NaiveBackend
        inner, calls = NaiveBackend().prepare(spec, inputs).fn, [0]

        def call():
            out = inner()
            calls[0] += 1
            return Outputs(out=out.out + 0.5 * (calls[0] - 1))
        return Prepared(fn=call, rewind=(lambda: calls.__setitem__(0, 0)) if self.says_how_to_rewind else None)


class _StateRunsOnSilently(_StateRunsOn):
    name = "test-state-runs-on-silently"
    says_how_to_rewind = False


def test_a_kernel_whose_state_runs_on_is_checked_from_the_cases_state():
    from attnbench.backends import registry
    for cls in (_StateRunsOn, _StateRunsOnSilently):
        registry.register(cls.name, cls)
    spec = AttnSpec(seqlens_q=(100,), heads_q=2, head_dim=16, dtype="fp32")
    recs = run(spec, [_StateRunsOn.name, _StateRunsOnSilently.name])
    rewound = recs[_StateRunsOn.name]
    assert rewound.status == "ok" and rewound.accuracy["repeat"]["after_timing"] == "pass"
    assert rewound.accuracy["repeat"]["deterministic"] is True  # the two calls after timing both start over
    silent = recs[_StateRunsOnSilently.name]  # the after-timing call starts from a state the timed calls moved
    assert silent.status == "mismatch" and silent.reason.startswith("a call after the timed calls: out")

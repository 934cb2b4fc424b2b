"""External profilers over a sweep: one profiler process per backend, each case in its own block, a failing
case failing alone, a crashed session falling back to one process per case.

The profiler is replaced by a stand-in that reads the child's job file and answers as ncu would: a CSV of
the marked launch sequence of every case that ran, each call one kernel lasting seq_len / 1000 ms.
"""

import json
import subprocess

import pytest

from attnbench.spec import AttnSpec
from attnbench.timing import child, external

MARK = "bitwise_not<int>"
FAIL_HEADS = 3
"""A case with this many query heads fails in the child before its timed range."""
CRASH_SEQ = 99
"""A session holding a case of this length crashes as a whole (as a segfault would)."""


def spec(seq: int, heads: int = 2) -> AttnSpec:
    return AttnSpec(seqlens_q=(seq,), heads_q=heads, head_dim=16)


class FakeNcu:
    def __init__(self):
        self.jobs: list[list[AttnSpec]] = []

    def __call__(self, cmd, **kwargs):
        job = json.loads(open(cmd[-1]).read())
        cases = [AttnSpec.from_dict(c["spec"]) for c in job["cases"]]
        self.jobs.append(cases)
        if any(s.seqlens_q[0] == CRASH_SEQ for s in cases):
            return subprocess.CompletedProcess(cmd, -11, "", "Segmentation fault")
        rows, results = [], []
        for case, s in zip(job["cases"], cases):
            if s.heads_q == FAIL_HEADS:
                results.append({"backend": case["backend"], "error": "OutOfMemoryError: CUDA out of memory"})
                continue
            kernels = [MARK]
            for _ in range(case["iterations"]):
                kernels += [MARK, f"attn_{s.seqlens_q[0]}"]
            kernels.append(MARK)
            for name in kernels:
                ns = 1000 if name == MARK else s.seqlens_q[0] * 1000
                rows.append(f'"{len(rows)}","{name}","gpu__time_duration.sum","nsecond","{ns}"')
            results.append({"backend": case["backend"], "info": {"seq": s.seqlens_q[0]}})
        open(job["result"], "w").write(json.dumps(results))
        head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
        return subprocess.CompletedProcess(cmd, 0, "\n".join(["==PROF== Connected", head, *rows]), "")


@pytest.fixture
def ncu(monkeypatch):
    fake = FakeNcu()
    monkeypatch.setattr(external, "find_tool", lambda tool: "/opt/ncu")
    monkeypatch.setattr(external.subprocess, "run", fake)
    return fake


def sessions(cases, **kwargs):
    return external.ProfileSessions("ncu", cases, iterations=3, device="cuda", **kwargs)


def test_one_process_per_backend_and_each_case_gets_its_own_calls(ncu):
    cases = [(spec(n), "a") for n in (100, 200, 300, 400)] + [(spec(n), "b") for n in (500, 600)]
    s = sessions(cases)
    for sp, backend in cases:
        samples, info = s.measure(sp, backend)
        assert samples == pytest.approx([sp.seqlens_q[0] / 1000] * 3)
        assert info["kernels"] == [f"attn_{sp.seqlens_q[0]}"] and info["child_info"] == {"seq": sp.seqlens_q[0]}
        assert info["profiler_session"]["cases"] == (4 if backend == "a" else 2)
    assert [len(job) for job in ncu.jobs] == [4, 2]
    assert not s.done  # every result handed out once


def test_a_session_holds_at_most_batch_cases_and_starts_at_the_case_asked_for(ncu):
    cases = [(spec(n), "a") for n in range(100, 600, 100)]
    s = sessions(cases, batch=2)
    s.measure(spec(300), "a")
    assert ncu.jobs == [[spec(300), spec(100)]]
    for n in (100, 200, 400, 500):
        s.measure(spec(n), "a")
    assert ncu.jobs[1:] == [[spec(200), spec(400)], [spec(500)]]


def test_a_case_failing_in_the_child_fails_alone(ncu):
    cases = [(spec(100), "a"), (spec(200, heads=FAIL_HEADS), "a"), (spec(300), "a")]
    s = sessions(cases)
    assert s.measure(spec(100), "a")[0] == pytest.approx([0.1] * 3)
    with pytest.raises(external.CaseFailed, match="out of memory"):
        s.measure(spec(200, heads=FAIL_HEADS), "a")
    assert s.measure(spec(300), "a")[0] == pytest.approx([0.3] * 3)
    assert len(ncu.jobs) == 1


def test_a_crashed_session_is_profiled_again_one_case_per_process(ncu):
    cases = [(spec(100), "a"), (spec(CRASH_SEQ), "a"), (spec(300), "a"), (spec(400), "b")]
    s = sessions(cases)
    assert s.measure(spec(100), "a")[0] == pytest.approx([0.1] * 3)
    with pytest.raises(RuntimeError, match="exit -11"):
        s.measure(spec(CRASH_SEQ), "a")
    samples, info = s.measure(spec(300), "a")
    assert samples == pytest.approx([0.3] * 3) and info["profiler_session"]["cases"] == 1
    assert s.measure(spec(400), "b")[1]["profiler_session"]["cases"] == 1  # another backend: its own session
    assert ncu.jobs == [[spec(100), spec(CRASH_SEQ), spec(300)], [spec(100)], [spec(CRASH_SEQ)], [spec(300)],
                        [spec(400)]]


def test_a_session_stopped_by_ctrl_c_ends_the_run_instead_of_recording_an_error(ncu):
    s = sessions([(spec(CRASH_SEQ), "a"), (spec(100), "a")], stopped=lambda: True)
    with pytest.raises(KeyboardInterrupt):
        s.measure(spec(CRASH_SEQ), "a")
    assert len(ncu.jobs) == 1


def test_the_child_reports_a_failing_case_and_runs_the_next(monkeypatch):
    from attnbench.backends import registry

    real = registry.get

    class Refuses:
        name = "refuses"

        def prepare_case(self, spec, inputs):
            raise ValueError("head size 16 is not compiled in\nsecond line")

    monkeypatch.setattr(registry, "get", lambda name, options=None: Refuses() if name == "refuses" else real(name, options))
    job = {"device": "cpu", "seed": 0, "warmup": 1, "cold_l2": False,
           "cases": [{"spec": spec(32).to_dict(), "backend": "naive", "iterations": 2},
                     {"spec": spec(32).to_dict(), "backend": "refuses", "iterations": 2},
                     {"spec": spec(48).to_dict(), "backend": "naive", "iterations": 2}]}
    results = child.run_job(job)
    assert [r.get("error") for r in results] == [None, "ValueError: head size 16 is not compiled in", None]
    assert [r["backend"] for r in results] == ["naive", "refuses", "naive"]


def test_a_sweep_under_a_profiler_starts_it_once_per_backend(ncu):
    from attnbench.runner import Runner, RunOptions
    from attnbench.timing import TimingConfig

    records = []
    options = RunOptions(device="cpu", backends=("naive", "sdpa-math"), timing=TimingConfig(mode="ncu", repeat=3))
    Runner(options, run_id="r", env_id=None, sink=records.append).run([spec(n) for n in (32, 48, 64)])
    assert [len(job) for job in ncu.jobs] == [3, 3]
    assert [r.status for r in records] == ["ok"] * 6
    assert [r.median_ms for r in records] == pytest.approx([0.032, 0.032, 0.048, 0.048, 0.064, 0.064])
    assert {r.info["profiler_session"]["cases"] for r in records} == {3}


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_bad_profiler_batch_is_one_line_and_exit_2(value):
    from reliability_helpers import attnbench

    res = attnbench("run", "--device", "cpu", "--profiler-batch", value, "--seq-lens", "16", "--quiet")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--profiler-batch" in res.stderr, res.stderr


def test_the_child_makes_fewer_calls_of_a_long_case_as_the_events_timer_samples(monkeypatch):
    """A case whose calls would add up to more than the events timer's cap makes fewer of them (never under
    MIN_SAMPLES) and says how many; the parent cuts the trace by that count."""
    import time

    from attnbench.backends import registry
    from attnbench.backends.base import Prepared
    from attnbench.timing.config import MIN_SAMPLES

    real = registry.get
    calls = {"n": 0}

    class Slow:
        name = "slow"

        def prepare_case(self, spec, inputs):
            def fn():
                calls["n"] += 1
                time.sleep(0.02)
            return Prepared(fn=fn)

    monkeypatch.setattr(registry, "get", lambda name, options=None: Slow() if name == "slow" else real(name, options))
    job = {"device": "cpu", "seed": 0, "warmup": 10, "cold_l2": False, "max_time_ms": 100.0,
           "cases": [{"spec": spec(32).to_dict(), "backend": "slow", "iterations": 30}]}
    (slow,) = child.run_job(job)
    assert slow["iterations"] == MIN_SAMPLES  # 20+ ms calls under a 100 ms cap: the fewest samples a median takes
    assert calls["n"] - slow["iterations"] <= 2  # warm-up stopped after a quarter of the cap, not 10 calls
    job["max_time_ms"] = None  # no cap (fixed configs): every call asked
    assert child.run_job(job)[0]["iterations"] == 30
    job = {"device": "cpu", "seed": 0, "warmup": 2, "cold_l2": False, "max_time_ms": 10_000.0,
           "cases": [{"spec": spec(32).to_dict(), "backend": "naive", "iterations": 30}]}
    assert child.run_job(job)[0]["iterations"] == 30  # calls well under the cap: every call asked


def test_the_parent_cuts_the_trace_by_the_calls_the_child_made(ncu, monkeypatch):
    real = ncu.__call__

    def fewer(cmd, **kwargs):  # the child made 2 calls of the first case, not the 3 asked
        job = json.loads(open(cmd[-1]).read())
        job["cases"][0]["iterations"] = 2
        open(cmd[-1], "w").write(json.dumps(job))
        out = real(cmd, **kwargs)
        results = json.loads(open(job["result"]).read())
        results[0]["iterations"] = 2
        open(job["result"], "w").write(json.dumps(results))
        return out

    monkeypatch.setattr(external.subprocess, "run", fewer)
    s = sessions([(spec(100), "a"), (spec(200), "a")])
    first, second = s.measure(spec(100), "a"), s.measure(spec(200), "a")
    assert first[0] == pytest.approx([0.1] * 2) and second[0] == pytest.approx([0.2] * 3)


class FakeRun:
    """run_external's stand-in: records each session's (backend, seq_len) cases; every call lasts seq_len / 1000 ms."""

    def __init__(self):
        self.jobs: list[list[tuple[str, int]]] = []

    def __call__(self, tool, cases, **kwargs):
        self.jobs.append([(c.backend, c.spec.seqlens_q[0]) for c in cases])
        if any(c.spec.seqlens_q[0] == CRASH_SEQ for c in cases):
            raise RuntimeError("Nsight Systems run failed (exit -11): Segmentation fault")
        return [([c.spec.seqlens_q[0] / 1000] * c.iterations, {"backend": c.backend}) for c in cases]


@pytest.mark.parametrize("tool, jobs", [
    ("nsys", [[("a", 100), ("b", 100), ("a", 200)], [("b", 200)]]),  # any backend's next cases, batch by batch
    ("ncu", [[("a", 100), ("a", 200)], [("b", 100), ("b", 200)]]),  # a process per backend
    ("rocprof", [[("a", 100), ("a", 200)], [("b", 100), ("b", 200)]])])
def test_nsys_takes_the_next_cases_of_any_backend_ncu_and_rocprof_those_of_one(monkeypatch, tool, jobs):
    fake = FakeRun()
    monkeypatch.setattr(external, "run_external", fake)
    cases = [(spec(n), b) for n in (100, 200) for b in ("a", "b")]  # the runner's order: shape-major
    s = external.ProfileSessions(tool, cases, iterations=2, device="cuda", batch=3)
    for sp, backend in cases:
        samples, info = s.measure(sp, backend)
        assert samples == pytest.approx([sp.seqlens_q[0] / 1000] * 2) and info["backend"] == backend
    assert fake.jobs == jobs and not s.done


def test_a_crashed_session_of_several_backends_is_profiled_again_one_case_per_process(monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(external, "run_external", fake)
    cases = [(spec(100), "a"), (spec(100), "b"), (spec(CRASH_SEQ), "a"), (spec(300), "b")]
    s = external.ProfileSessions("nsys", cases, iterations=1, device="cuda")
    assert s.measure(spec(100), "a")[1]["profiler_session"]["cases"] == 1
    assert s.measure(spec(100), "b")[0] == pytest.approx([0.1])
    with pytest.raises(RuntimeError, match="exit -11"):
        s.measure(spec(CRASH_SEQ), "a")
    assert s.measure(spec(300), "b")[1]["profiler_session"]["cases"] == 1
    assert fake.jobs == [[("a", 100), ("b", 100), ("a", CRASH_SEQ), ("b", 300)], [("a", 100)], [("b", 100)],
                         [("a", CRASH_SEQ)], [("b", 300)]]

"""The pipeline: statuses, durability of each record, and no lost results."""

import sqlite3

import torch

from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Outputs, Prepared
from attnbench.results.store import ResultStore
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

SPECS = [AttnSpec(seqlens_q=(s,), heads_q=2, head_dim=8, dtype="fp32", pass_=p) for s in (17, 33) for p in ("fwd", "bwd")]
FAST = TimingConfig(warmup=0, repeat=2)


class Exploding(Backend):
    name = "test-explode"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        raise RuntimeError("kernel launch failed\nsecond line")


class OutOfMemory(Backend):
    name = "test-oom"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34 GiB")


class MakesNan(Backend):
    name = "test-nan"
    capabilities = Capabilities(backward=False)

    def prepare(self, spec, inputs):
        return Prepared(fn=lambda: Outputs(out=torch.full_like(inputs.q, float("nan"))))


def test_statuses_and_every_record_durable_before_next_case(tmp_path):
    for cls in (Exploding, OutOfMemory, MakesNan):
        registry.register(cls.name, cls)
    store = ResultStore(tmp_path / "r.db")
    seen_counts = []

    def on_case(spec, name):
        # A separate connection sees every earlier record already committed.
        with sqlite3.connect(tmp_path / "r.db") as conn:
            seen_counts.append(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    names = ("naive", "test-explode", "test-oom", "test-nan")
    runner = Runner(RunOptions(device="cpu", backends=names, timing=FAST), run_id="r1", env_id=None,
                    sink=store.write, on_case=on_case)
    records = runner.run(SPECS)
    assert seen_counts == list(range(len(SPECS) * len(names)))
    by = {(r.backend, r.spec.seqlens_q[0], r.spec.pass_): r for r in records}
    assert by[("naive", 17, "bwd")].status == "ok" and by[("naive", 17, "bwd")].tflops > 0
    err = by[("test-explode", 33, "fwd")]
    assert err.status == "error" and err.reason == "RuntimeError: kernel launch failed"
    assert by[("test-oom", 17, "fwd")].status == "oom"
    assert by[("test-nan", 17, "fwd")].status == "nan" and by[("test-nan", 17, "fwd")].median_ms is None
    assert by[("test-nan", 17, "bwd")].status == "unsupported"
    assert len(store.records("r1")) == len(records)


def test_skip_resumes_only_missing_cases(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    opts = RunOptions(device="cpu", backends=("naive",), timing=FAST)
    first = Runner(opts, run_id="r", env_id=None, sink=store.write).run(SPECS[:2])
    again = Runner(opts, run_id="r", env_id=None, sink=store.write, skip=store.case_ids("r")).run(SPECS)
    assert len(first) == 2 and [r.spec for r in again] == SPECS[2:]


def test_record_round_trips_through_store(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    rec = Runner(RunOptions(device="cpu", backends=("naive",), timing=FAST), run_id="x", env_id="e",
                 sink=store.write).run(SPECS[:1])[0]
    back = store.records("x")[0]
    assert back.spec == rec.spec and back.samples_ms == rec.samples_ms and back.case_id == rec.case_id
    assert back.peak_mem_bytes is None  # CPU: not measured, not zero

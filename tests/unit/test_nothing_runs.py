"""A run that can run nothing here says so and fails (exit 2), and builds no inputs for cases no backend takes."""

import sqlite3

import pytest
from results_fixtures import attnbench, cli

from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

FAST = TimingConfig(warmup=0, repeat=2)
SMALL = ["--device", "cpu", "--q-heads", "2", "--head-size", "8", "--dtype", "fp32", "--quiet"]


def test_inputs_are_built_only_for_shapes_a_backend_takes(monkeypatch):
    """A paged serving step on a CPU (no CPU kernel reads pages) made its inputs for nothing: 50 s for
    2q2k_128q1kv2k. Now a shape is built when its first case that a backend takes comes, and never otherwise."""
    built = []
    import attnbench.inputs as inputs_mod  # what the attention operator calls (attnbench.operators)
    make = inputs_mod.make_inputs
    monkeypatch.setattr(inputs_mod, "make_inputs", lambda spec, *a, **k: built.append(spec) or make(spec, *a, **k))
    paged = AttnSpec(seqlens_q=(4, 1), seqlens_k=(4, 40), heads_q=2, head_dim=8, dtype="fp32", causal=True,
                     page_size=16)
    plain = paged.replace(page_size=None)
    records = []
    Runner(RunOptions(device="cpu", backends=("naive", "sdpa-math"), timing=FAST), run_id="r", env_id=None,
           sink=records.append).run([paged, plain])
    assert [(r.status, r.spec.page_size) for r in records] == [("unsupported", 16)] * 2 + [("ok", None)] * 2
    assert all("paged" in r.reason for r in records[:2])
    assert built == [plain]  # the paged shape's inputs were never made


def test_a_sweep_no_backend_takes_is_refused_before_anything_runs(tmp_path):
    """`run --batch ... --page-size 1 16` on a CPU printed '0 of 6 cases ran' under a TF/s header and exited 0.
    Now: one line counting the reasons and naming the option that would let the cases run; nothing stored."""
    db = tmp_path / "r.db"
    res = attnbench("run", *SMALL, "--batch", "2q16_4q1kv64", "--page-size", "1", "16", "--db", db)
    assert res.returncode == 2, res.stderr
    line, = res.stderr.strip().splitlines()
    assert line.startswith("attnbench: error: nothing to run") and "no paged KV cache" in line
    assert "--page-size none runs them on naive" in line and "Traceback" not in res.stderr
    assert not db.exists()
    # what the line suggests runs
    ok = attnbench("run", *SMALL, "--batch", "2q16_4q1kv64", "--page-size", "none", "16", "--db", db,
                   "--backends", "naive")
    assert ok.returncode == 0, ok.stderr
    with sqlite3.connect(db) as conn:
        assert sorted(conn.execute("SELECT status FROM records")) == [("ok",), ("unsupported",)]


def test_a_named_backend_that_takes_no_case_is_refused(tmp_path):
    """The README: a backend named with --backends that cannot run is exit 2. sdpa-flash takes no grouped batch."""
    db = tmp_path / "r.db"
    res = attnbench("run", *SMALL, "--backends", "sdpa-flash", "--batch", "2q16kv64", "--db", db)
    assert res.returncode == 2, res.stderr
    line, = res.stderr.strip().splitlines()
    assert "backend sdpa-flash cannot run the case here: varlen" in line and "naive" in line  # who can
    assert not db.exists()
    # with another backend that takes the case, it is still refused: it would only record 'unsupported'
    res = attnbench("run", *SMALL, "--backends", "naive,sdpa-flash", "--seq-lens", "16,16", "32,8",
                    "--pass", "fwd", "--no-causal", "--db", db)
    assert res.returncode == 2, res.stderr
    assert "backend sdpa-flash takes none of the 2 cases here: varlen" in res.stderr
    # a grouped --seq-lens typed for one case per length: the refusal says so
    res = attnbench("run", *SMALL, "--backends", "sdpa-flash", "--seq-lens", "64,96", "--pass", "fwd", "--no-causal",
                    "--db", db)
    assert res.returncode == 2 and "--seq-lens 64 96 (one case per length) runs it on sdpa-flash" in res.stderr
    # --skip-missing records its cases as unsupported, as documented
    res = attnbench("run", *SMALL, "--skip-missing", "--backends", "naive,sdpa-flash", "--seq-lens", "16,16",
                    "--db", db)
    assert res.returncode == 0, res.stderr


class Failing(Backend):
    name = "test-fails-everywhere"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        raise RuntimeError("no kernel image is available for execution on the device")


@pytest.fixture
def failing_backend():
    registry.register(Failing.name, Failing)
    yield Failing.name
    registry.unregister(Failing.name)


def test_a_run_where_no_case_ran_exits_2(tmp_path, failing_backend):
    """Cases a backend takes but that all fail (or run out of memory) leave nothing timed: the records are
    stored, the last line counts why, and the exit status is 2, not the 0 of a run that answered."""
    res = cli("run", *SMALL, "--backends", failing_backend, "--seq-lens", "16", "32", "--pass", "fwd", "--no-causal",
              "--db", tmp_path / "r.db")
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("attnbench: none of the 2 cases ran here (2 error: RuntimeError: no kernel image")
    with sqlite3.connect(tmp_path / "r.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM records WHERE status='error'").fetchone() == (2,)

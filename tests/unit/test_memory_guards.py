"""Every path that allocates a case's memory asks its guard first: a case that cannot fit is refused in one line
(or recorded as ``oom``) before anything is allocated. The guards are called with a small fake free-memory figure,
so nothing here allocates what it estimates."""

from __future__ import annotations

import pytest

from attnbench import cli, memory, operators
from attnbench.backends import registry
from attnbench.cli import run as run_cmd

MiB = 1 << 20
GiB = 1 << 30


class Accepted(BaseException):
    """Raised instead of running a plan: the input was accepted."""


@pytest.fixture
def no_execution(monkeypatch):
    def refuse(plan, **kwargs):
        raise Accepted(plan)
    monkeypatch.setattr(run_cmd, "execute", refuse)


def refused(argv, capsys) -> str:
    """The one line of a command line refused with exit status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnbench") and "Traceback" not in err, err
    return lines[0]


def free(monkeypatch, nbytes: int) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda device: nbytes)


# ---- recurrences: the chunk ----------------------------------------------------------------------------------
def test_a_chunk_longer_than_every_sequence_is_refused(capsys, no_execution, tmp_path):
    line = refused(["run", "--device", "cpu", "--op", "gdn", "--seq-lens", "64", "--chunk", "100000",
                    "--db", str(tmp_path / "r.db")], capsys)
    assert "--chunk 100000" in line and "64 tokens" in line and "at most 64" in line
    assert not (tmp_path / "r.db").exists()
    with pytest.raises(ValueError, match="--chunk 100000"):
        import attnbench
        attnbench.plan(op="gdn", seq_lens=[64], chunk=100000, device="cpu")
    # a chunk up to the longest sequence of the sweep (or the default 64) is a case
    for argv in (["--seq-lens", "64", "4096", "--chunk", "128"], ["--seq-lens", "17", "--chunk", "64"]):
        with pytest.raises(Accepted):
            cli.main(["run", "--device", "cpu", "--op", "gdn", *argv, "--db", str(tmp_path / "r.db")])


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_the_chunk_forms_matrices_count_in_the_recurrence_guard(monkeypatch, kind):
    from attnbench.linear.spec import RecurrenceSpec
    from attnbench.linear.torch_forms import CHUNK_TEMP_BYTES
    expected = CHUNK_TEMP_BYTES[(kind == "kda", "fwd")] * (32 if kind == "kda" else 1)  # per element (kda: × d_k)
    op = operators.get("recurrence")
    chunked = registry.get("torch-chunked")
    small = RecurrenceSpec(kind=kind, seqlens=(64,), heads_qk=2, d_k=32, chunk=64)
    big = small.replace(chunk=4096)
    assert chunked.workspace_bytes(big) == 1 * 2 * 4096 * 4096 * expected
    free(monkeypatch, 64 * MiB)  # the inputs and the 64-token chunks fit; 4096 x 4096 matrices do not
    assert op.memory_guard(small, chunked, "cpu") is None
    assert op.memory_guard(big, None, "cpu", inputs_allocated=False) is None  # the inputs alone are small
    reason = op.memory_guard(big, chunked, "cpu")
    assert reason and "needs about" in reason and "64.0 MiB free" in reason
    assert op.memory_guard(big, registry.get("torch-recurrent"), "cpu") is None  # the token loop has no chunks
    # a fwd_bwd keeps every chunk's matrices for the backward
    long = RecurrenceSpec(kind=kind, seqlens=(1000,), heads_qk=2, d_k=32, chunk=100, pass_="fwd_bwd")
    assert chunked.workspace_bytes(long) == 10 * chunked.workspace_bytes(long.replace(seqlens=(100,)))


# ---- verify: run's guard -----------------------------------------------------------------------------------------
def test_verify_refuses_a_sweep_whose_inputs_cannot_fit_before_allocating(capsys, monkeypatch, tmp_path):
    import attnbench
    free(monkeypatch, 1 * MiB)
    db = tmp_path / "v.db"
    line = refused(["verify", "--device", "cpu", "--seq-lens", "64k", "--backends", "naive", "--db", str(db)], capsys)
    assert "too large for cpu" in line and "s65536" in line and "1.0 MiB free" in line and "--seq-lens" in line
    assert not db.exists()
    with pytest.raises(ValueError, match="too large for cpu"):
        attnbench.verify(seq_lens=[10**9], device="cpu", db=str(db))
    with pytest.raises(ValueError, match="too large for cpu"):  # run's plan is the same
        attnbench.plan(seq_lens=["64k"], device="cpu", backends="naive", db=str(db))
    assert not db.exists()


def test_verify_guards_each_shapes_inputs(monkeypatch):
    """A sweep where some shapes fit: the others are oom records, their inputs never made."""
    import attnbench.inputs as inputs_mod
    from attnbench.cli import verify as verify_cmd
    made = []
    real = inputs_mod.make_inputs

    def spy(spec, *args, **kwargs):
        made.append(spec.seqlens_q)
        return real(spec, *args, **kwargs)
    monkeypatch.setattr(inputs_mod, "make_inputs", spy)
    plan = verify_cmd.verify_plan({"device": "cpu", "seq_lens": ["16", "4096"], "backends": ["naive"],
                                   "q_heads": ["4"], "head_size": ["64"], "dtype": "fp32"})
    free(monkeypatch, 2 * MiB)  # the 16-token case fits; the 4096-token one's inputs (4 MiB each) do not
    records = verify_cmd.run_checks(plan, "r", None, lambda record: None)
    by = {r.spec.seqlens_q[0]: r for r in records}
    assert by[4096].status == "oom" and by[4096].reason.startswith("inputs: needs"), by[4096].reason
    assert by[16].status == "ok"
    assert (4096,) not in made


# ---- the indexer -------------------------------------------------------------------------------------------------
def test_the_indexer_guard_counts_its_queries_and_the_product_per_head(capsys, monkeypatch, no_execution, tmp_path):
    from attnbench.sparse.indexer_op import IndexerSpec
    op = operators.get("indexer")
    many_heads = IndexerSpec(s_q=16, s_kv=16, heads=1_000_000, dim=128, topk=16)
    free(monkeypatch, 4 * GiB)  # the (T, Hi, S) product is 1 GiB; q alone is 2 GiB in e4m3, 41 GB while drawn
    assert op.memory_guard(many_heads, None, "cpu", inputs_allocated=False)
    line = refused(["run", "--device", "cpu", "--op", "indexer", "--seq-lens", "16", "--kv-seq-lens", "16",
                    "--q-heads", "1000000", "--topk", "16", "--db", str(tmp_path / "i.db")], capsys)
    assert "too large for cpu" in line and "h1000000" in line
    # a call holds fp32 q·k for every head: 8 bytes per (query, head, key)
    wide = IndexerSpec(s_q=256, s_kv=4096, heads=1024, dim=64, topk=16)
    assert op.memory_guard(wide, None, "cpu", inputs_allocated=False) is None  # its inputs are 0.3 GiB drawn
    reason = op.memory_guard(wide, registry.get("indexer-torch"), "cpu")  # 256 x 1024 x 4096 x 8 = 8 GiB
    assert reason and "needs about 8." in reason
    free(monkeypatch, 16 * GiB)
    assert op.memory_guard(wide, registry.get("indexer-torch"), "cpu") is None


# ---- a shared prefix written out per request ------------------------------------------------------------------
def test_the_guard_counts_a_shared_prefix_written_out_for_every_request(monkeypatch):
    """A kernel that takes no shared prefix gets every request's keys with the prefix in front (``expanded``, made
    in prepare, beside the inputs that store the prefix once): the guard, asked once the inputs exist, must count
    that copy (the serving trace's first step, 193 requests over a 1k prefix, held 22 GB on a CPU)."""
    from attnbench.spec import AttnSpec
    spec = AttnSpec(seqlens_q=(1,) * 64, seqlens_k=(4096,) * 64, heads_q=8, heads_kv=8, head_dim=64, dtype="bf16",
                    causal=True, shared_prefix=4032, pass_="fwd")
    naive, flex = registry.get("naive"), registry.get("flex")
    written_out = 64 * 4096 * 8 * 128 * 2  # every request's keys and values: 512 MiB
    assert memory.estimate(spec, naive).copies == written_out and memory.estimate(spec, flex).copies == 0
    free(monkeypatch, 256 * MiB)  # the scores and outputs fit; the written-out keys do not
    reason = memory.guard(spec, naive, "cpu")
    assert reason and "256.0 MiB free" in reason
    assert memory.guard(spec, flex, "cpu") is None  # a kernel that takes the prefix stored once


# ---- sparse MLA on FlexAttention's math --------------------------------------------------------------------------
def test_uncompiled_flex_sparse_mla_counts_its_expanded_rows(monkeypatch):
    """Eager FlexAttention (the CPU) expands the one KV head to every query head: at the V4 decode preset that is
    the 128 GiB allocation the CPU allocator refused; the guard refuses it first."""
    from attnbench.sparse.spec import SparseSpec
    op = operators.get("sparse-mla")
    flex = registry.get("flex-sparse-mla")
    v4 = SparseSpec(batch=64, s_q=2, s_kv=16384, heads=64, topk=128, d_qk=512, d_v=512, extra=(16384, 512),
                    sink=True, indices="random")
    expanded = 64 * 64 * 32768 * 1024  # rows, heads, keys (main and extra cache), d_qk + d_v
    assert flex.workspace_bytes(v4, "cpu") >= expanded * 6  # bf16, and again in fp32
    assert flex.workspace_bytes(v4, "cuda") == 0  # compiled: a fused kernel
    free(monkeypatch, 64 * GiB)
    assert op.memory_guard(v4, None, "cpu", inputs_allocated=False) is None  # the inputs fit
    reason = op.memory_guard(v4, flex, "cpu")
    assert reason and "64.0 GiB free" in reason
    small = SparseSpec(batch=2, s_q=2, s_kv=2048, heads=16, topk=64, indices="random")
    free(monkeypatch, 1 * GiB)  # measured: 389 MiB
    assert flex.workspace_bytes(small, "cpu") >= 389 * MiB and op.memory_guard(small, flex, "cpu") is None


def test_a_cpu_allocation_failure_is_an_oom_record():
    import math

    from attnbench.backends.base import Backend, Capabilities
    from attnbench.plausibility import Ceilings
    from attnbench.runner import Runner, RunOptions
    from attnbench.spec import AttnSpec
    from attnbench.timing import TimingConfig

    class Greedy(Backend):
        name = "test-greedy"
        capabilities = Capabilities(dtypes=("fp32",), backward=False)

        def prepare(self, spec, inputs):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 137438953472 bytes.")
    registry.register(Greedy.name, Greedy)
    out = []
    Runner(RunOptions(device="cpu", backends=(Greedy.name,), timing=TimingConfig(warmup=0, repeat=1),
                      ceilings=Ceilings(tflops=math.inf, gbps=math.inf, source="test")), run_id="r", env_id=None,
           sink=out.append).run([AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd")])
    assert [r.status for r in out] == ["oom"] and "can't allocate memory" in out[0].reason


# ---- a serving batch on the materialising backends ---------------------------------------------------------------
def test_grouped_kv_is_expanded_one_request_at_a_time_in_a_forward():
    """naive and sdpa-math run a serving batch a request at a time: the K/V heads they expand for GQA (MLA's one
    latent head for 128 query heads) are one request's in a forward, not the batch's (DeepSeek-V3's decode batch
    of 128 requests over 1k..32k keys was estimated at 611.8 GiB)."""
    from attnbench.spec import AttnSpec
    lengths = (1024, 4096, 32768)
    spec = AttnSpec(seqlens_q=(1,) * 3, seqlens_k=lengths, heads_q=128, heads_kv=1, head_dim=576, head_dim_v=512,
                    dtype="bf16", causal=True, pass_="fwd")
    naive = registry.get("naive")
    one_request = 32768 * 128 * (576 + 512) * 2
    assert memory.estimate(spec, naive).workspace == memory.score_bytes(spec, 2, (2, 3)) + one_request
    every_request = sum(lengths) * 128 * (576 + 512) * 2  # a backward keeps every request's
    bwd = spec.replace(pass_="fwd_bwd")
    assert memory.estimate(bwd, naive).workspace == memory.score_bytes(bwd, 2, (2, 3)) + every_request

"""Sharded sweeps (--shard I/N and torchrun) and `attnbench merge`."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from results_fixtures import SRC, cli

from attnbench import shard
from attnbench.results import merge as mergemod
from attnbench.results.record import Record, case_id
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec
from attnbench.sweep import Sweep

SWEEP = Sweep(batch_sizes=(1, 3), seq_lens=((17,), (128,), (577,), (1024,), (64, 77)), q_heads=(2, 8),
              head_sizes=(64, 128), causal=(False, True), passes=("fwd", "bwd", "fwd_bwd"))
RUN = ["--device", "cpu", "--seq-lens", "17", "33", "16,16", "--q-heads", "2", "--head-size", "8", "--dtype", "fp32",
       "--backends", "naive", "--pass", "fwd", "--causal", "both", "--warmup", "0", "--repeat", "2", "--quiet"]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 200])
def test_every_case_lands_on_exactly_one_shard(n):
    specs = SWEEP.specs()
    parts = [shard.select(specs, shard.Shard(index=i, count=n)) for i in range(n)]
    assert Counter(s for p in parts for s in p) == Counter(specs)
    # whole shapes stay together (inputs are built once per shape) and keep their order
    owners = {}
    for i, part in enumerate(parts):
        assert part == [s for s in specs if s in set(part)]
        for s in part:
            assert owners.setdefault(s.shape_key(), i) == i
    # deterministic: every rank computes the same split on its own
    assert shard.assign(specs, n) == shard.assign(list(specs), n)


def test_split_balances_the_work():
    specs = SWEEP.specs()
    owner = shard.assign(specs, 4)
    load = Counter()
    for s, o in zip(specs, owner, strict=True):
        load[o] += shard._cost(s)
    biggest_shape = max(sum(shard._cost(t) for t in specs if t.shape_key() == s.shape_key()) for s in specs)
    assert len(load) == 4 and max(load.values()) - min(load.values()) <= biggest_shape


def test_shard_parsing_env_paths_and_devices():
    assert shard.parse("1/4") == shard.Shard(index=1, count=4)
    for bad in ("4/4", "1-4", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="I/N|0 <= I < N"):
            shard.parse(bad)
    assert shard.from_env({}) is None and shard.from_env({"WORLD_SIZE": "1"}) is None
    part = shard.from_env({"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1"})
    assert (part.index, part.count, part.local_rank) == (5, 8, 1)
    assert shard.db_path(Path("r/a.db"), part) == Path("r/a.rank5.db")
    assert shard.db_path(Path("r/a-{rank}.sqlite"), part) == Path("r/a-5.sqlite")
    assert shard.db_path(Path("r/a.db"), None) == Path("r/a.db")
    assert shard.device_for("cuda", part) == "cuda:1" and shard.device_for("cuda:3", part) == "cuda:3"
    assert shard.device_for("cpu", part) == "cpu"
    with pytest.raises(ValueError, match="--run-id"):
        shard.shared_run_id(shard.Shard(index=0, count=2), None, lambda: "x")


def _records(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT run_id, case_id, status FROM records ORDER BY case_id").fetchall()


def _expected_case_ids() -> set[str]:
    specs = [AttnSpec(seqlens_q=s, heads_q=2, head_dim=8, dtype="fp32", causal=c, pass_="fwd")
             for s in ((17,), (33,), (16, 16)) for c in (False, True)]
    return {case_id(s, "naive", "cpu") for s in specs}


def test_manual_shards_then_merge_give_the_whole_sweep(tmp_path):
    db = tmp_path / "sweep.db"
    res = cli("run", *RUN, "--shard", "0/2", "--db", db)
    assert res.returncode == 2 and "--run-id" in res.stderr and not list(tmp_path.iterdir())
    for i in range(2):
        res = cli("run", *RUN, "--shard", f"{i}/2", "--run-id", "sweep-1", "--db", db)
        assert res.returncode == 0, res.stderr
    rank0, rank1 = tmp_path / "sweep.rank0.db", tmp_path / "sweep.rank1.db"
    assert not db.exists() and rank0.is_file() and rank1.is_file()
    a, b = _records(rank0), _records(rank1)
    assert a and b and not {r[1] for r in a} & {r[1] for r in b}
    res = cli("run", *RUN, "--shard", "0/2", "--run-id", "sweep-1", "--db", db)
    assert res.returncode == 2 and "already exists" in res.stderr
    merged = tmp_path / "merged.db"
    res = cli("merge", merged, rank0, rank1)
    assert res.returncode == 0, res.stderr
    assert "merged 6 records" in res.stdout
    rows = _records(merged)
    assert {r[1] for r in rows} == _expected_case_ids() and len(rows) == 6
    assert {r[0] for r in rows} == {"sweep-1"} and {r[2] for r in rows} == {"ok"}
    with ResultStore(merged, create=False) as store:
        (run,) = store.runs()
        assert run["run_id"] == "sweep-1" and run["status"] == "done"
        assert store.env(store.rows()[0]["env_id"])["device"] == "cpu"


def _record(run_id: str, seq: int, status: str = "ok") -> Record:
    spec = AttnSpec(seqlens_q=(seq,), heads_q=2, head_dim=8, dtype="fp32")
    return Record(run_id=run_id, backend="naive", spec=spec, status=status, median_ms=1.0, samples_ms=[1.0, 1.1])


def test_merge_keeps_every_record_and_combines_runs(tmp_path):
    paths = []
    for i, (run_status, seqs) in enumerate([("done", (16, 17)), ("interrupted", (33,)), ("done", (64, 65, 66))]):
        path = tmp_path / f"part{i}.db"
        with ResultStore(path) as store:
            store.add_env(f"env{i}", {"device": f"cuda:{i}"})
            store.start_run("r", command="attnbench run", config={}, env_id=f"env{i}", version="t")
            for s in seqs:
                store.write(_record("r", s))
            store.finish_run("r", run_status)
            store.start_run(f"other{i}", command="x", config={}, env_id=None, version="t")
            store.write(_record(f"other{i}", 8, status="error"))
        paths.append(path)
    out = tmp_path / "all.db"
    summary = mergemod.merge(out, paths)
    assert summary.records == 9 and summary.runs["r"] == 3
    with ResultStore(out, create=False) as store:
        assert len(store.rows("r")) == 6 and len(store.rows()) == 9
        assert store.run("r")["status"] == "interrupted"  # one part did not finish
        assert {store.env(f"env{i}")["device"] for i in range(3)} == {"cuda:0", "cuda:1", "cuda:2"}
        assert Record.from_row(store.rows("r")[0]).samples_ms == [1.0, 1.1]
    again = mergemod.merge(out, paths[:1])  # merging a file twice adds nothing
    assert again.records == 0 and again.duplicates == 3
    with pytest.raises(ValueError, match="both an input and the output"):
        mergemod.merge(paths[0], paths)
    assert cli("merge", out, tmp_path / "missing.db").returncode == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_splits_one_sweep_over_ranks(tmp_path):
    db = tmp_path / "tr.db"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "attnbench", "run",
           *RUN, "--db", str(db)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    parts = [tmp_path / "tr.rank0.db", tmp_path / "tr.rank1.db"]
    rows = [r for p in parts for r in _records(p)]
    assert len({r[0] for r in rows}) == 1, "every rank must write the same run id"
    assert sorted(r[1] for r in rows) == sorted(_expected_case_ids())
    res = cli("merge", tmp_path / "m.db", *parts)
    assert res.returncode == 0 and len(_records(tmp_path / "m.db")) == 6

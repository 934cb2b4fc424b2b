"""`latest`, the views' default run, is the newest sweep of `attnbench run`: a verify (one call a case, no speed),
an e2e or a dist run after it is passed over, and every view says which run it shows."""

import json

import numpy as np
import pytest
from results_fixtures import cli, synthetic_record

from attnbench.cli.view import latest_timed, run_command
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

TIMED, CHECKED = "20261128-100000-aaaaaa", "20261128-110000-bbbbbb"


@pytest.fixture
def store(tmp_path):
    """A timed run, then a verify of the same backends (one call per case), as `run` then `verify` store them."""
    db = tmp_path / "r.db"
    rng = np.random.default_rng(0)
    with ResultStore(db) as s:
        for run_id, command, n in ((TIMED, "attnbench run --seq-lens 1k 2k", 12),
                                   (CHECKED, "attnbench verify --device cpu", 1)):
            s.start_run(run_id, command=command, config={}, env_id=None, version="test")
            for seq in (1024, 2048):
                spec = AttnSpec(seqlens_q=(seq,), heads_q=4, head_dim=64, dtype="bf16", pass_="fwd")
                for backend in ("sdpa-flash", "sdpa-math"):
                    samples = list(rng.normal(seq / 1024, 0.01, n))
                    s.write(synthetic_record(run_id, spec, backend, samples,
                                             accuracy={"verdict": "pass", "tensors": {}}))
            s.finish_run(run_id)
    return db


def test_run_command_and_latest_timed():
    runs = [{"run_id": "a", "command": "attnbench run"}, {"run_id": "b", "command": "attnbench verify --json"},
            {"run_id": "c", "command": "attnbench verify (from Python)"}]
    assert [run_command(r) for r in runs] == ["run", "verify", "verify"]
    assert latest_timed(runs)["run_id"] == "a"
    assert latest_timed(runs[1:])["run_id"] == "c"  # only verifies: the newest of them
    assert latest_timed([*runs, {"run_id": "d", "command": "synthetic"}])["run_id"] == "d"  # unknown: timed
    assert latest_timed([*runs, {"run_id": "e", "command": "attnbench e2e --model llama-tiny"},
                         {"run_id": "f", "command": "attnbench dist --nproc 2"}])["run_id"] == "a"


@pytest.mark.parametrize("view", ["show", "export", "report", "plot"])
def test_views_default_to_the_newest_timed_run_and_say_so(store, tmp_path, view):
    args = {"show": ["show"], "export": ["export", "--format", "json"],
            "report": ["report", "-o", tmp_path / "r.html"],
            "plot": ["plot", "--x", "seq_len", "--y", "ms", "-o", tmp_path / "p.svg"]}[view]
    res = cli(*args, "--db", store)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    line = next(x for x in lines if x.startswith("attnbench: run "))
    assert line.startswith(f"attnbench: run {TIMED} (") and ", run --seq-lens 1k 2k)" in line
    assert line.endswith("): the newest sweep") and len(line) <= 100
    assert f"attnbench: passed over newer runs, not sweeps: 1 verify (--run {CHECKED})" in lines
    if view == "export":
        assert {r["run_id"] for r in json.loads(res.stdout)} == {TIMED}  # stdout stays the data alone
    if view == "report":
        html = (tmp_path / "r.html").read_text()
        assert f"Run {TIMED}" in html and CHECKED not in html
    if view == "show":
        assert "4 of 4 cases ran" in res.stdout


def test_an_explicit_run_is_shown_without_the_line(store):
    res = cli("show", "--db", store, "--run", CHECKED)
    assert res.returncode == 0 and "attnbench: run " not in res.stderr


def test_a_store_of_verifies_only_shows_the_newest_and_says_it(tmp_path):
    db = tmp_path / "v.db"
    with ResultStore(db) as s:
        s.start_run("v1", command="attnbench verify", config={}, env_id=None, version="test")
        s.write(synthetic_record("v1", AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=8, dtype="fp32"), "naive", [1.0]))
        s.finish_run("v1")
    res = cli("export", "--db", db)
    assert res.returncode == 0, res.stderr
    assert "attnbench: run v1 (" in res.stderr
    assert "the newest run, a verify: no run in this store is a sweep of attnbench run" in res.stderr


def test_the_line_naming_the_chosen_run_fits_100_columns(tmp_path):
    db = tmp_path / "w.db"
    timed, newest = "20261128-100000-aaaaaa", "20261128-120000-cccccc"
    command = "attnbench run --preset qwen3-next-80b --seq-lens 4k 16k --backends naive,sdpa-math --baseline naive"
    with ResultStore(db) as s:
        for run_id, text in ((timed, command), ("20261128-110000-bbbbbb", "attnbench verify --device cpu"),
                             (newest, "attnbench e2e --model llama-tiny --device cpu")):
            s.start_run(run_id, command=text, config={}, env_id=None, version="test")
            s.write(synthetic_record(run_id, AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=8, dtype="fp32"),
                                     "naive", [1.0, 1.1]))
            s.finish_run(run_id)
    res = cli("show", "--db", db)
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("attnbench: ")]
    assert len(lines) == 2 and max(map(len, lines)) <= 100, lines
    assert lines[0].startswith(f"attnbench: run {timed} (") and ", run --preset qwen3-next" in lines[0]
    assert lines[0].endswith("…): the newest sweep")  # the command cut, the rest whole
    assert lines[1] == f"attnbench: passed over newer runs, not sweeps: 1 verify, 1 e2e (--run {newest})"

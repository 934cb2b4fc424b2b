"""What a user reads and copies, laid out for 100 columns: tables that keep run ids and case labels whole, cells
that show their numbers, marks that are explained, units and words that say what they mean."""

from __future__ import annotations

import pytest
from results_fixtures import cli, synthetic_record

from attnbench.cli import common
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

WIDTH = 100


@pytest.fixture(autouse=True)
def hundred_columns(monkeypatch):
    """Every console the CLI prints through is 100 columns wide, as a pipe with COLUMNS=100 is."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "width", WIDTH)


def widest(text: str) -> int:
    return max((len(line.rstrip()) for line in text.splitlines()), default=0)


def test_runs_keeps_every_run_id_on_one_line(tmp_path):
    db = tmp_path / "r.db"
    long_command = ("attnbench run --device cuda --backends fa2,fa3,flashinfer,sdpa-flash --seq-lens 512..16k:x2 "
                    "--preset gpt-oss-20b --db /a/long/path/to/the/results/attnbench.db")
    ids = ["20261128-034310-adbdc0", "20261128-034311-adbdc1"]
    with ResultStore(db) as store:
        store.add_env("e1", {"device_name": "NVIDIA H100 80GB HBM3"})
        for run_id in ids:
            store.start_run(run_id, command=long_command, config={}, env_id="e1", version="test")
            store.finish_run(run_id)
    res = cli("runs", "--db", db)
    assert res.returncode == 0, res.stderr
    assert all(run_id in res.stdout for run_id in ids)  # whole, where a user copies them from
    assert widest(res.stdout) <= WIDTH

"""A run id names files (``report-ID.html``, plots): wherever an id comes in (the command line, the Python API,
``--resume``, a store merged in, a store written by other means), one that could name a file outside its folder
is refused in one line, and nothing is written."""

import sqlite3

import pytest
from reliability_helpers import TINY, attnbench

HOSTILE = "../../../out/pwn"
API_TINY = dict(device="cpu", seq_lens="16", q_heads=1, head_size=8, dtype="fp32", pass_="fwd", causal=False,
                backends="naive", warmup=0, repeat=1)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_api_refuses_an_id_the_command_line_refuses(tmp_path):
    import attnbench
    db = tmp_path / "a" / "b" / "s.db"
    for bad in (HOSTILE, "latest", "", "x" * 65, 5):
        with pytest.raises(ValueError, match="bad run_id"):
            attnbench.run(db=str(db), run_id=bad, **API_TINY)
    assert _files(tmp_path) == []  # refused before the store was made


def test_a_store_claims_no_run_under_an_id_that_names_no_file(tmp_path):
    from attnbench.results.store import BadRunId, ResultStore
    with ResultStore(tmp_path / "s.db") as store, pytest.raises(BadRunId, match="bad run id"):
        store.start_run(HOSTILE, command="attnbench run", config={}, env_id=None, version="t")
    with ResultStore(tmp_path / "s.db", readonly=True) as store:
        assert store.runs() == []


@pytest.fixture
def hostile_store(tmp_path):
    """A store whose run id was rewritten to ``HOSTILE`` by another program."""
    db = tmp_path / "a" / "b" / "s.db"
    res = attnbench("run", *TINY, "--seq-lens", "16", "--backends", "naive", "--run-id", "fine", "--db", str(db))
    assert res.returncode == 0, res.stderr
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE runs SET run_id=?", (HOSTILE,))
        conn.execute("UPDATE records SET run_id=?", (HOSTILE,))
    conn.close()
    return db


@pytest.mark.parametrize("command", [
    ["report"], ["plot", "--x", "seq_len", "--y", "ms"], ["merge", "{tmp}/merged.db", "{db}"],
    ["run", "--resume", HOSTILE],
])
def test_a_hostile_stored_id_names_no_file(tmp_path, hostile_store, command):
    before = _files(tmp_path)
    args = [a.format(tmp=tmp_path, db=hostile_store) for a in command]
    if command[0] != "merge":
        args += ["--db", str(hostile_store)]
    res = attnbench(*args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "bad" in lines[0] and f"'{HOSTILE}': it holds '/'" in lines[0], lines[0]
    assert _files(tmp_path) == before  # nothing written, inside the folder or out of it


def test_a_hostile_stored_id_still_reports_to_a_file_given(tmp_path, hostile_store):
    res = attnbench("report", "--db", str(hostile_store), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r.html").is_file() and not (tmp_path / "out").exists()

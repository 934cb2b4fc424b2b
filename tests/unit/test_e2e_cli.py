"""`attnbench e2e` and `--backend-opt` as a user runs them (subprocesses on the checkout's src)."""

import json
import sqlite3

from test_cli import attnbench


def test_e2e_llama_tiny_writes_one_record_per_backend(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "e2e.json"
    res = attnbench("e2e", "--model", "llama-tiny", "--device", "cpu", "--backends", "naive,sdpa-math", "--layers", "2",
                    "--steps", "2", "--dtype", "fp32", "--seq-len", "33", "--db", str(db), "--output", str(out))
    assert res.returncode == 0, res.stderr
    for label in ("Attn (%)", "Attn (s)", "Total (s)", "naive (baseline)", "sdpa-math"):
        assert label in res.stdout
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT backend, status, timing_mode, seq_len, info FROM records").fetchall()
    assert [r[:4] for r in rows] == [("naive", "ok", "e2e", 33), ("sdpa-math", "ok", "e2e", 33)]
    info = json.loads(rows[1][4])["e2e"]
    assert info["calls"] == 2 and info["model"] == "llama-tiny" and info["rel_l1"] < 1e-5
    assert 0 < info["attn_share"] < 1
    assert len(json.loads(out.read_text())) == 2


def test_e2e_user_errors_exit_2_and_write_nothing(tmp_path):
    db = tmp_path / "r.db"
    for args, needle in ((["--model", "gpt-5"], "unknown --model"), (["--backends", "nope"], "unknown backend"),
                         (["--backend-opt", "flex-sparse.sparsity=3"], "sparsity")):
        res = attnbench("e2e", "--device", "cpu", "--db", str(db), *args)
        assert res.returncode == 2, (args, res.stderr)
        assert needle in res.stderr and res.stderr.count("\n") == 1
    assert not db.exists()


def test_run_rejects_a_bad_backend_opt(tmp_path):
    res = attnbench("run", "--device", "cpu", "--backends", "flex-sparse", "--backend-opt", "flex-sparse.bogus=1",
                    "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2 and "bogus" in res.stderr

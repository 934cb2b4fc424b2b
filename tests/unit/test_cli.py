"""The CLI end to end, in subprocesses, as a user runs it."""

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["--device", "cpu", "--seq-lens", "17", "33", "--q-heads", "2", "--head-size", "8", "--dtype", "fp32",
         "--warmup", "1", "--repeat", "2", "--backends", "naive,sdpa-math", "--causal", "both", "--quiet"]


SRC = str(Path(__file__).resolve().parents[2] / "src")


def attnbench(*args, cwd=None):
    # Run the checkout under test, whatever attnbench is installed.
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def db_rows(db, sql="SELECT backend, pass, seq_len, causal, status FROM records"):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_run_writes_db_and_json(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "out.json"
    res = attnbench("run", *SMALL, "--pass", "fwd", "fwd_bwd", "--db", str(db), "--output", str(out))
    assert res.returncode == 0, res.stderr
    rows = db_rows(db)
    # 2 lengths x 2 causal x 2 passes x 2 backends
    assert len(rows) == 16
    assert {r[0] for r in rows} == {"naive", "sdpa-math"}
    assert {r[2] for r in rows} == {17, 33}
    assert all(r[4] == "ok" for r in rows)
    data = json.loads(out.read_text())
    assert len(data) == 16 and all(d["median_ms"] > 0 and d["tflops"] > 0 for d in data)
    run_status = db_rows(db, "SELECT status FROM runs")
    assert run_status == [("done",)]


def test_grouped_seq_lens_and_csv(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "out.csv"
    res = attnbench("run", "--device", "cpu", "--seq-lens", "16,16,8", "--q-heads", "2", "--head-size", "8",
                    "--backends", "naive,sdpa-math,sdpa-flash", "--skip-missing", "--pass", "fwd", "--no-causal",
                    "--repeat", "2", "--quiet",
                    "--db", str(db), "--output", str(out))
    assert res.returncode == 0, res.stderr
    rows = dict((r[0], r[1:]) for r in db_rows(db, "SELECT backend, num_seqs, varlen, status, reason FROM records"))
    assert rows["naive"][:3] == (3, 1, "ok")
    assert rows["sdpa-math"][:3] == (3, 1, "ok")  # one SDPA call per sequence
    assert rows["sdpa-flash"][2] == "unsupported" and "varlen" in rows["sdpa-flash"][3]
    assert out.read_text().startswith("run_id,backend")


def test_the_naive_vs_fa2_scripts_flag_names_are_aliases(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--batch_size", "2", "--seq_len", "32", "--num_heads", "4",
                    "--emb_dim", "64", "--impl", "Pytorch", "--causal", "--repeats", "2", "--pass", "fwd",
                    "--quiet", "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert db_rows(db, "SELECT backend, batch, seq_len, heads_q, head_dim, causal FROM records") == [
        ("naive", 2, 32, 4, 16, 1)]


def test_yaml_config_with_cli_override(tmp_path):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("device: cpu\nseq_lens: ['16', '24']\nq_heads: 2\nhead_size: 8\nbackends: [naive]\n"
                   "pass: [fwd]\ncausal: false\nrepeat: 2\n")
    db = tmp_path / "r.db"
    res = attnbench("run", "--config", str(cfg), "--seq-lens", "40", "--quiet", "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert db_rows(db, "SELECT seq_len, heads_q FROM records") == [(40, 2)]


def test_range_syntax_expands(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--seq-lens", "16..64:x2", "--q-heads", "1", "--head-size", "8",
                    "--backends", "naive", "--pass", "fwd", "--no-causal", "--repeat", "1", "--quiet", "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert [r[2] for r in db_rows(db)] == [16, 32, 64]


@pytest.mark.parametrize("args, needle", [
    (["--q-heads", "12", "--kv-heads", "5"], "multiple of kv-heads"),
    (["--batch-size", "0"], "batch"),
    (["--q-heads", "-3"], "q-heads"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--backends", "nosuch"], "unknown backend 'nosuch'"),
    (["--seq-lens", ""], "seq-lens"),
    (["--head-size", "4096"], "head size must be an integer in 1..576"),
    (["--pass", "up"], "unknown pass 'up'"),
    (["--causal", "maybe"], None),
    (["--seq-lens", "64..16:x2"], "below start"),
    (["--seq-lens", "64,,64"], "empty item between commas"),
    (["--seq-lens", "128,"], "empty item between commas"),
    (["--batch-size", "2,,4"], "empty item between commas"),
    (["--device", "tpu"], "--device"),
    (["--output", "x.xlsx"], "output format"),
    (["--config", "/nonexistent.yaml"], "no such file"),
    (["--impl", "Flash9"], "--impl"),
    (["--no-such-flag"], "No such option"),
    (["--warmup", "-1"], "warmup"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--db", str(db), *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and lines[0].startswith("attnbench")
    if needle:
        assert needle in lines[0]
    assert not db.exists()


def test_bad_yaml_key_is_reported(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("seq_lenz: [128]\n")
    res = attnbench("run", "--device", "cpu", "--config", str(cfg), "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2 and "seq_lenz" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_backends_and_env_commands():
    res = attnbench("backends", "--device", "cpu", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["naive"]["available"] and not rows["sdpa-cudnn"]["available"]
    assert "cuda" in rows["sdpa-cudnn"]["reason"]
    res = attnbench("env", "--device", "cpu", "--json")
    assert res.returncode == 0, res.stderr
    env = json.loads(res.stdout)
    assert env["torch"] and env["platform"] in ("cpu", "cuda", "rocm") and len(env["env_id"]) == 12


@pytest.mark.parametrize("command", ["run", "verify", "dist", "e2e", "plot", "report", "export", "compare",
                                     "calibrate"])
def test_help_reads_as_users_type_it(command):
    res = attnbench(command, "--help")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "--causal-mode" not in text and "list[str]" not in text
    # a default written in [brackets] is eaten by the help's markup and leaves "file ." or "case )"
    assert not re.search(r"\s\.(\s|$)", text) and not re.search(r"\s\)", text), text
    if command in ("run", "verify", "dist"):
        assert "--causal,--no-causal" in text


def test_flags_show_no_value_type_in_help():
    import re

    from reliability_helpers import attnbench
    for command in ("export", "run", "backends"):
        res = attnbench(command, "--help", COLUMNS="150")
        assert res.returncode == 0
        flags = [line for line in res.stdout.splitlines() if re.search(r"--(help|json|all-runs|quiet)\b", line)]
        assert flags and not any("<bool>" in line for line in flags), flags


@pytest.mark.parametrize("command, env, needle", [
    (["dist", "--device", "cpu", "--seq-lens", "64"], {"WORLD_SIZE": "abc"}, "bad WORLD_SIZE='abc'"),
    (["dist", "--device", "cpu"], {"RANK": "x", "WORLD_SIZE": "2"}, "bad RANK='x'"),
    (["links", "--output", "LINKS"], {"WORLD_SIZE": "-3"}, "bad WORLD_SIZE='-3'"),
    (["run", "--device", "cpu"], {"WORLD_SIZE": "2", "RANK": "5"}, "ranks are 0..1"),
    # a rank past the world: torch.distributed's own ValueError, or a rank that waits for ever for its peers
    (["dist", "--device", "cpu", "--seq-lens", "64"], {"RANK": "3", "WORLD_SIZE": "2"}, "ranks are 0..1"),
    (["dist", "--device", "cpu", "--seq-lens", "64"],
     {"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}, "ranks are 0..1"),
    (["dist", "--device", "cpu", "--seq-lens", "64"], {"RANK": "1", "WORLD_SIZE": "1"}, "ranks are 0..0"),
    (["dist", "--device", "cpu", "--seq-lens", "64"], {"RANK": "0", "WORLD_SIZE": "1"},
     "MASTER_ADDR and MASTER_PORT are not"),
])
def test_torchrun_variables_that_are_not_torchrun_s_are_one_line(tmp_path, command, env, needle):
    full = dict(os.environ, PYTHONPATH=SRC, **env)
    out = tmp_path / ("l.json" if command[0] == "links" else "r.db")
    args = [str(out) if a == "LINKS" else a for a in command] + ([] if command[0] == "links" else ["--db", str(out)])
    res = subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, env=full,
                         timeout=300)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not out.exists()

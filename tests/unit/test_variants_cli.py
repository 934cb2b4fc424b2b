"""Sinks, softcap, ALiBi and the model presets from the command line, as a user runs them (subprocesses)."""

import json
import sqlite3

import pytest
from test_cli import attnbench

from attnbench import presets
from attnbench.cli import common
from attnbench.features.alibi import alibi_slopes
from attnbench.sweep import Sweep

TINY = ["--device", "cpu", "--seq-lens", "33", "--q-heads", "4", "--kv-heads", "2", "--head-size", "16", "--dtype",
        "fp32", "--warmup", "0", "--repeat", "2", "--quiet"]


def specs_of(db):
    with sqlite3.connect(db) as conn:
        return [(b, json.loads(s), label, status, json.loads(acc or "null"))
                for b, s, label, status, acc in conn.execute("SELECT backend, spec, label, status, accuracy FROM records")]


def test_variants_run_checked_on_the_cpu_and_are_in_every_record(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "r.csv"
    res = attnbench("run", *TINY, "--backends", "naive,sdpa-math", "--sinks", "both", "--softcap", "none", "30",
                    "--causal", "--pass", "fwd_bwd", "--skip-missing", "--db", str(db), "--output", str(out))
    assert res.returncode == 0, res.stderr
    rows = specs_of(db)
    assert len(rows) == 8  # sinks off/on x softcap none/30 x two backends
    for backend, spec, label, status, acc in rows:
        assert ("sinks" in label) == spec.get("sinks", False)
        assert ("softcap30" in label) == (spec.get("softcap") == 30.0)
        if backend == "sdpa-math" and spec.get("softcap"):
            assert status == "unsupported"  # no softcap through a mask
        else:
            assert status == "ok" and acc["verdict"] == "pass", acc
            assert ("dsinks" in acc["tensors"]) == spec.get("sinks", False)
    header = out.read_text().splitlines()[0].split(",")
    assert {"sinks", "softcap", "alibi"} <= set(header)


def test_cases_without_variants_keep_their_ids():
    spec = Sweep(seq_lens=((64,),), q_heads=(2,), causal=(True,), passes=("fwd",)).specs()[0]
    assert not {"sinks", "softcap", "alibi"} & set(spec.to_dict())  # so stored runs stay comparable


def test_preset_fills_the_model_and_flags_win(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--preset", "gpt-oss-20b", "--seq-lens", "40", "--head-size", "16",
                    "--backends", "naive", "--pass", "fwd", "--dtype", "fp32", "--repeat", "2", "--warmup", "0",
                    "--quiet", "--db", str(db))
    assert res.returncode == 0, res.stderr
    specs = [s for _, s, *_ in specs_of(db)]
    assert {s["window"] and tuple(s["window"]) for s in specs} == {None, (127, 0)}  # full and local layers
    for s in specs:
        assert (s["heads_q"], s["heads_kv"], s["head_dim"], s["sinks"], s["causal"]) == (64, 8, 16, True, True)


def test_gemma_presets_carry_their_softmax_scale():
    opts = presets.apply({"q_heads": None}, "gemma2-27b")
    sweep = common.build_sweep(opts, "cpu")
    spec = sweep.specs()[0]
    assert spec.softmax_scale == pytest.approx(144 ** -0.5) and spec.head_dim == 128 and spec.softcap == 50.0
    bloom = common.build_sweep(presets.apply({}, "bloom-176b"), "cpu").specs()[0]
    assert bloom.alibi == alibi_slopes(112)


def test_alibi_slopes_file_sets_the_slopes(tmp_path):
    slopes = tmp_path / "slopes.txt"
    slopes.write_text("0.5, 0.25\n0.125 1e-2\n")
    db = tmp_path / "r.db"
    res = attnbench("run", *TINY, "--backends", "naive", "--alibi-slopes", str(slopes), "--pass", "fwd", "--db", str(db))
    assert res.returncode == 0, res.stderr
    (_, spec, label, status, acc), = specs_of(db)[:1]
    assert spec["alibi"] == [0.5, 0.25, 0.125, 0.01] and label.split()[-1].startswith("alibi:") and acc["verdict"] == "pass"


@pytest.mark.parametrize("args, needle", [
    (["--softcap", "0"], "bad --softcap '0'"),
    (["--softcap", "-5"], "bad --softcap"),
    (["--softcap", "inf"], "bad --softcap"),
    (["--softcap", "nan"], "bad --softcap"),
    (["--alibi-slopes", "SLOPES3"], "ALiBi needs one slope per query head: 3 slopes for 4 q-heads"),
    (["--alibi-slopes", "/nonexistent/slopes.txt"], "no such file"),
    (["--alibi-slopes", "BADSLOPES"], "'x' is not a finite number"),
    (["--sinks", "--backends", "sdpa-flash"], "backend sdpa-flash cannot run attention sinks"),
    (["--softcap", "50", "--backends", "sdpa-math"], "backend sdpa-math cannot run a logit softcap"),
    (["--preset", "llama-9"], "unknown --preset 'llama-9'"),
    (["--softmax-scale", "0"], "bad --softmax-scale"),
    (["--window", "3,x"], "bad --window"),
])
def test_bad_variant_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    (tmp_path / "s3.txt").write_text("0.5 0.25 0.125")
    (tmp_path / "bad.txt").write_text("0.5 x 0.25 0.1")
    args = [str(tmp_path / "s3.txt") if a == "SLOPES3" else str(tmp_path / "bad.txt") if a == "BADSLOPES" else a
            for a in args]
    db = tmp_path / "r.db"
    res = attnbench("run", *TINY, "--db", str(db), *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr and needle in lines[0], res.stderr
    assert not db.exists()


def test_yaml_takes_the_variant_keys(tmp_path):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("sinks: both\nsoftcap: [none, 20]\nalibi: true\nwindow: [none, [7, 0]]\ncausal: true\n"
                   "pass: fwd\nbackends: naive\n")
    db = tmp_path / "r.db"
    res = attnbench("run", *TINY, "--config", str(cfg), "--db", str(db))
    assert res.returncode == 0, res.stderr
    specs = [s for _, s, *_ in specs_of(db)]
    assert len(specs) == 8 and all(s["alibi"] == list(alibi_slopes(4)) for s in specs)
    assert {(s.get("sinks", False), s.get("softcap"), s["window"] and tuple(s["window"])) for s in specs} == {
        (a, b, c) for a in (False, True) for b in (None, 20.0) for c in (None, (7, 0))}


def test_verify_checks_the_bug_prone_shapes_with_the_variant(tmp_path):
    res = attnbench("verify", "--device", "cpu", "--backends", "naive,sdpa-math", "--sinks", "--alibi",
                    "--db", str(tmp_path / "v.db"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every case with sinks, alibi" in res.stdout
    specs = [s for _, s, *_ in specs_of(tmp_path / "v.db")]
    assert len(specs) == 20 and all(s["sinks"] and s["alibi"] == list(alibi_slopes(s["heads_q"])) for s in specs)


@pytest.mark.parametrize("args, needle", [
    (["--sinks", "both"], "a model has sinks or not"),
    (["--softcap", "0"], "bad --softcap '0'"),
    (["--sliding-window", "0"], "--sliding-window"),
    (["--model", "cogvideox-2b", "--alibi"], "switches of the Llama models"),
])
def test_e2e_variant_switches_refuse_bad_input(tmp_path, args, needle):
    res = attnbench("e2e", "--device", "cpu", "--db", str(tmp_path / "r.db"), *args)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_e2e_runs_a_llama_with_sinks_softcap_and_local_layers(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("e2e", "--device", "cpu", "--backends", "naive,sdpa-math", "--sinks", "--softcap", "30",
                    "--sliding-window", "8", "--layers", "2", "--steps", "1", "--dtype", "fp32", "--db", str(db))
    assert res.returncode == 0, res.stderr
    rows = specs_of(db)
    assert [(b, st) for b, _, _, st, _ in rows] == [("naive", "ok"), ("sdpa-math", "unsupported")]
    assert rows[0][1]["sinks"] and rows[0][1]["softcap"] == 30.0

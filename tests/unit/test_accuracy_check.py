"""The checker in the pipeline: broken toy backends are caught by Runner, `run --check` and `verify`."""

import json
import math
import sqlite3

import pytest
import torch

from attnbench.accuracy import check as checkmod
from attnbench.accuracy.check import AccuracyChecker, io_bytes
from attnbench.accuracy.reference import reference_attention
from attnbench.backends import registry
from attnbench.backends.base import Capabilities, Outputs, Prepared
from attnbench.backends.naive import NaiveBackend
from attnbench.cli import main
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

FAST = TimingConfig(warmup=0, repeat=1)


class UnwrittenRows(NaiveBackend):
    """Forgets the last three query rows of every sequence (left as zeros here; NaN under poisoning)."""

    name = "test-unwritten-rows"
    capabilities = Capabilities(backward=False)

    def prepare(self, spec, inputs):
        good = super().prepare(spec, inputs).fn

        def fn():
            out = torch.zeros_like(inputs.q[..., :spec.head_dim_v])
            out[:, :-3] = good().out[:, :-3]
            return Outputs(out=out)
        return Prepared(fn=fn, info={"kernel": "broken"})


class GqaMeanNotSum(NaiveBackend):
    """GQA bug: dK averaged over the q heads of a group instead of summed."""

    name = "test-gqa-mean"

    def prepare(self, spec, inputs):
        good = super().prepare(spec, inputs).fn
        groups = spec.heads_q // spec.heads_kv

        def fn():
            res = good()
            if res.dk is not None:
                res.dk = res.dk / groups
            return res
        return Prepared(fn=fn, info={"kernel": "broken"})


class Noisy(NaiveBackend):
    """An 'approximate' backend: the exact output plus relative noise of a set size."""

    name = "test-noisy"
    capabilities = Capabilities(backward=False, exact=False)
    noise = 0.01

    def prepare(self, spec, inputs):
        good = super().prepare(spec, inputs).fn
        gen = torch.Generator().manual_seed(0)

        def fn():
            out = good().out
            return Outputs(out=out + self.noise * out.abs().mean() * torch.randn(out.shape, generator=gen))
        return Prepared(fn=fn, info={"kernel": "noisy"})


class WithLse(NaiveBackend):
    """Also returns the LSE the way flash-attn does: fp32, natural log, +inf on rows with no key."""

    name = "test-with-lse"
    capabilities = Capabilities(backward=False)
    log_base = math.e

    def prepare(self, spec, inputs):
        good = super().prepare(spec, inputs).fn
        lse = reference_attention(spec, inputs, grads=False).lse / math.log(self.log_base)
        lse = torch.where(torch.isinf(lse), math.inf, lse).float()
        return Prepared(fn=lambda: Outputs(out=good().out, lse=lse), info={"kernel": "lse"})


class Log2Lse(WithLse):
    name = "test-log2-lse"
    log_base = 2.0


class VeryNoisy(Noisy):
    name = "test-very-noisy"
    noise = 0.5


@pytest.fixture(autouse=True)
def toy_backends():
    for cls in (UnwrittenRows, GqaMeanNotSum, Noisy, VeryNoisy, WithLse, Log2Lse):
        registry.register(cls.name, cls)


def run(specs, names, checker=None):
    checker = checker or AccuracyChecker()
    runner = Runner(RunOptions(device="cpu", backends=tuple(names), timing=FAST), run_id="t", env_id=None,
                    sink=lambda r: None, checker=checker)
    return {(r.backend, r.spec.pass_, r.spec.causal): r for r in runner.run(specs)}


SPEC = AttnSpec(seqlens_q=(77,), heads_q=4, heads_kv=2, head_dim=16, dtype="bf16", causal=True)


def test_correct_backends_pass_broken_ones_are_mismatches():
    specs = [SPEC.replace(pass_=p) for p in ("fwd", "fwd_bwd")]
    recs = run(specs, ["naive", "sdpa-math", "test-unwritten-rows", "test-gqa-mean"])
    for name in ("naive", "sdpa-math"):
        for p in ("fwd", "fwd_bwd"):
            rec = recs[(name, p, True)]
            assert rec.status == "ok" and rec.accuracy["verdict"] == "pass", (name, p, rec.accuracy.get("reason"))
    rows = recs[("test-unwritten-rows", "fwd", True)]
    assert rows.status == "mismatch" and rows.reason.startswith("out ") and rows.median_ms is not None
    gqa = recs[("test-gqa-mean", "fwd_bwd", True)]
    assert gqa.status == "mismatch" and "dk" in gqa.reason and "dq" not in gqa.reason
    assert recs[("test-gqa-mean", "fwd", True)].status == "ok"  # the forward is right
    full = recs[("naive", "fwd_bwd", True)].accuracy
    assert set(full["tensors"]) == {"out", "dq", "dk", "dv"} and set(full["baseline"]) == set(full["tensors"])
    assert full["reference"].startswith("float64 cpu")
    for m in ("max_abs", "mean_abs", "rel_l2", "cosine", "rel_l1", "rmse"):
        assert m in full["tensors"]["dk"]


def test_lse_is_checked_and_infinite_lse_of_empty_rows_is_not_nan():
    spec = AttnSpec(seqlens_q=(40,), seqlens_k=(17,), heads_q=2, head_dim=8, dtype="fp16", causal=True)
    recs = run([spec], ["test-with-lse", "test-log2-lse"])
    good = recs[("test-with-lse", "fwd", True)]
    assert good.status == "ok" and good.accuracy["verdict"] == "pass", good.reason
    assert good.accuracy["tensors"]["lse"]["max_abs"] < 1e-2 and "lse" in good.accuracy["limits"]
    bad = recs[("test-log2-lse", "fwd", True)]
    assert bad.status == "mismatch" and bad.reason.startswith("lse ")


def test_bwd_pass_checks_out_and_grads():
    recs = run([SPEC.replace(pass_="bwd")], ["naive", "test-gqa-mean"])
    assert set(recs[("naive", "bwd", True)].accuracy["tensors"]) == {"out", "dq", "dk", "dv"}
    assert recs[("test-gqa-mean", "bwd", True)].status == "mismatch"


def test_approximate_backends_get_approx_verdicts_and_keep_status_ok():
    recs = run([SPEC.replace(pass_="fwd")], ["test-noisy", "test-very-noisy"])
    ok, bad = recs[("test-noisy", "fwd", True)], recs[("test-very-noisy", "fwd", True)]
    assert ok.accuracy["verdict"] == "approx-pass" and ok.status == "ok" and not ok.accuracy["exact"]
    assert bad.accuracy["verdict"] == "approx-fail" and bad.status == "ok" and "cosine" in bad.accuracy["reason"]
    assert "baseline" not in ok.accuracy


def test_reference_is_computed_once_per_case_across_passes_and_backends(monkeypatch):
    calls = []
    real = checkmod.reference_attention

    def counting(spec, inputs, **kw):
        calls.append((spec.pass_, kw["grads"]))
        return real(spec, inputs, **kw)

    monkeypatch.setattr(checkmod, "reference_attention", counting)
    specs = [SPEC.replace(pass_=p) for p in ("fwd_bwd", "fwd", "bwd")]
    run(specs, ["naive", "sdpa-math"])
    assert calls == [("fwd_bwd", True)]  # fwd and bwd reuse the fwd_bwd reference


def test_grads_ahead_computes_one_reference_for_fwd_then_fwd_bwd(monkeypatch):
    calls = []
    real = checkmod.reference_attention

    def counting(spec, inputs, **kw):
        calls.append((spec.pass_, kw["grads"]))
        return real(spec, inputs, **kw)

    monkeypatch.setattr(checkmod, "reference_attention", counting)
    specs = [SPEC.replace(pass_=p) for p in ("fwd", "fwd_bwd")]
    recs = run(specs, ["naive"], checker=AccuracyChecker(grads_ahead=True))
    assert calls == [("fwd", True)]
    assert set(recs[("naive", "fwd", True)].accuracy["tensors"]) == {"out"}
    assert set(recs[("naive", "fwd_bwd", True)].accuracy["tensors"]) == {"out", "dq", "dk", "dv"}
    calls.clear()
    run(specs, ["naive"])  # without it the forward case computes its own, smaller reference
    assert calls == [("fwd", False), ("fwd_bwd", True)]


def test_cache_is_bounded():
    checker = AccuracyChecker(cache_size=1)
    run([SPEC, SPEC.replace(causal=False), SPEC.replace(seqlens_q=(33,))], ["naive"], checker=checker)
    assert len(checker._cache) == 1


def test_poison_is_a_no_op_on_cpu_and_sized_from_the_case():
    assert AccuracyChecker().poison(SPEC, "cpu") == 0
    assert io_bytes(SPEC) == 2 * (77 * 4 * 32 + 77 * 2 * 32) * 2


def test_verify_prints_a_grid_and_details_on_request(tmp_path, capsys):
    args = ["verify", "--device", "cpu", "--seq-lens", "33", "100", "--q-heads", "4", "--kv-heads", "2", "--head-size",
            "16", "--dtype", "fp32", "--causal", "--backends", "naive,sdpa-math", "--db", str(tmp_path / "g.db")]
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    assert "diff:" not in out  # nothing failed: no per-case details
    rows = [line.split() for line in out.splitlines() if line.startswith(("naive ", "sdpa-math "))]
    assert [r[0] for r in rows] == ["naive", "sdpa-math"] and all(len(r) == 3 for r in rows)
    assert all(0 <= float(x) < 1 for r in rows for x in r[1:])  # worst error / limit of each case: passing
    assert "1 s33; 2 s100" in " ".join(out.split()) and "2 checked" not in out and "4 checked" in out


def test_verify_cli_prints_seed_block_and_passes(tmp_path, capsys):
    db = tmp_path / "v.db"
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--seq-lens", "33", "--q-heads", "4", "--kv-heads", "2", "--head-size",
              "16", "--dtype", "fp32", "--causal", "--backends", "naive,sdpa-math", "--db", str(db), "--details"])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    lines = [line for line in out.splitlines() if "diff:" in line]
    assert [line.split(":")[0] for line in lines[:8]] == [
        "Output max diff", "Output mean diff", "dQ max diff", "dK max diff", "dV max diff",
        "dQ mean diff", "dK mean diff", "dV mean diff"]
    assert "PASS" in out and "rel L2" in out and "cosine" in out
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT backend, pass, status, accuracy, n FROM records").fetchall()
    assert {(r[0], r[1], r[2]) for r in rows} == {("naive", "fwd_bwd", "ok"), ("sdpa-math", "fwd_bwd", "ok")}
    assert all(json.loads(r[3])["verdict"] == "pass" and r[4] == 1 for r in rows)


def test_verify_cli_exits_1_on_a_broken_exact_backend(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--seq-lens", "33", "--q-heads", "4", "--kv-heads", "2", "--head-size",
              "16", "--dtype", "bf16", "--backends", "naive,test-gqa-mean,test-unwritten-rows,test-very-noisy",
              "--db", str(tmp_path / "v.db"), "--json"])
    assert exc.value.code == 1
    rows = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["naive"]["status"] == "ok"
    assert rows["test-gqa-mean"]["status"] == "mismatch" and rows["test-gqa-mean"]["pass"] == "fwd_bwd"
    # forward-only backends are checked on the forward pass instead of being skipped
    assert rows["test-unwritten-rows"]["pass"] == "fwd" and rows["test-unwritten-rows"]["status"] == "mismatch"
    assert rows["test-very-noisy"]["accuracy"]["verdict"] == "approx-fail"


def test_verify_cli_approximate_failure_alone_exits_0(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--seq-lens", "33", "--q-heads", "2", "--head-size", "8",
              "--backends", "test-very-noisy", "--db", str(tmp_path / "v.db")])
    assert exc.value.code == 0 and "APPROX-FAIL" in capsys.readouterr().out


def test_run_checks_by_default_and_not_with_no_check(tmp_path, capsys):
    args = ["run", "--device", "cpu", "--seq-lens", "17", "--q-heads", "2", "--head-size", "8", "--dtype", "fp32",
            "--backends", "naive,test-gqa-mean", "--kv-heads", "1", "--pass", "fwd_bwd", "--no-causal",
            "--repeat", "1", "--warmup", "0", "--quiet"]
    for flag, db, code in (([], tmp_path / "a.db", 1), (["--no-check"], tmp_path / "b.db", 0)):
        with pytest.raises(SystemExit) as exc:
            main([*args, *flag, "--db", str(db)])
        assert exc.value.code == code  # a mismatch fails the run; unchecked, nothing can
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("attnbench: 1 of 2 cases wrong (mismatch test-gqa-mean fwd_bwd ") and len(last) <= 100
    with sqlite3.connect(tmp_path / "a.db") as conn:
        checked = dict(conn.execute("SELECT backend, status FROM records").fetchall())
        acc = json.loads(conn.execute("SELECT accuracy FROM records WHERE backend='naive'").fetchone()[0])
    assert checked == {"naive": "ok", "test-gqa-mean": "mismatch"} and acc["verdict"] == "pass"
    with sqlite3.connect(tmp_path / "b.db") as conn:
        rows = conn.execute("SELECT status, accuracy FROM records").fetchall()
    assert rows == [("ok", "null"), ("ok", "null")]


def test_run_fails_on_an_approximate_failure_only_when_asked(tmp_path, capsys):
    args = ["run", "--device", "cpu", "--seq-lens", "33", "--q-heads", "2", "--head-size", "8", "--pass", "fwd",
            "--backends", "naive,test-very-noisy", "--repeat", "1", "--warmup", "0", "--quiet"]
    for flag, code in (([], 0), (["--fail-on-approx"], 1)):
        with pytest.raises(SystemExit) as exc:
            main([*args, *flag, "--db", str(tmp_path / f"r{code}.db")])
        assert exc.value.code == code
    assert "test-very-noisy" in capsys.readouterr().err.strip().splitlines()[-1]


def test_verify_bad_input_is_exit_2_and_writes_nothing(tmp_path, capsys):
    db = tmp_path / "v.db"
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "cpu", "--dtype", "int8", "--db", str(db)])
    assert exc.value.code == 2 and "unknown dtype 'int8'" in capsys.readouterr().err
    assert not db.exists()


def test_the_baseline_keeps_gqa_heads_uncopied_above_the_size_limit(monkeypatch):
    """Past EXPAND_MAX_BYTES the yardstick stacks each group's query rows on its one K/V head instead of copying
    K/V per query head (an MLA decode batch would need a terabyte): the same output and dQ, dK/dV within the
    dtype's rounding of a sum over the group."""
    from attnbench.accuracy import baseline
    from attnbench.backends.naive import NaiveBackend
    from attnbench.inputs import make_inputs
    from attnbench.spec import AttnSpec
    spec = AttnSpec(seqlens_q=(48,), heads_q=8, heads_kv=2, head_dim=16, dtype="bf16", causal=True, pass_="fwd_bwd")
    inputs = make_inputs(spec, "cpu")
    naive = NaiveBackend().prepare(spec, inputs).fn().tensors()
    assert all(torch.equal(baseline.math_baseline(spec, inputs)[n], naive[n]) for n in ("out", "dq", "dk", "dv"))
    copies = []
    monkeypatch.setattr(baseline, "expand_kv_heads", lambda t, g: copies.append(g) or t.repeat_interleave(g, 2))
    monkeypatch.setattr(baseline, "EXPAND_MAX_BYTES", 0)
    stacked = baseline.math_baseline(spec, inputs)
    assert copies == []  # no copy per query head
    assert torch.equal(stacked["out"], naive["out"]) and torch.equal(stacked["dq"], naive["dq"])
    for name in ("dk", "dv"):
        assert (stacked[name].float() - naive[name].float()).abs().max() <= 4 * 2 ** -8 * naive[name].abs().max()

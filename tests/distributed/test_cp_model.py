"""The context-parallel scaling model: its kernel curves, its accounting, and the `cp-model` command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.distributed import model as cpm

ROOT = Path(__file__).resolve().parents[2]


def _curves(tflops_by_len: dict[int, float]) -> cpm.KernelCurves:
    rows = []
    for s, tf in tflops_by_len.items():
        for causal in (0, 1):
            for pass_ in ("fwd", "fwd_bwd"):
                flops = cpm.Problem(1, s, 8, 8, 128, bool(causal), pass_).flops()
                rows.append({"kernel": "k", "batch": 1, "seq_len": s, "heads": 8, "head_dim": 128, "causal": causal,
                             "pass": pass_, "median_ms": flops / (tf * 1e12) * 1e3})
    return cpm.KernelCurves(rows)


def test_curve_returns_measured_rates_and_interpolates_between_them():
    curves = _curves({1024: 200.0, 4096: 400.0})
    small = cpm.Problem(1, 1024, 8, 8).flops()
    large = cpm.Problem(1, 4096, 8, 8).flops()
    assert curves.rate("k", "fwd", False, small) == pytest.approx(200e12)
    assert curves.rate("k", "fwd", False, large) == pytest.approx(400e12)
    assert curves.rate("k", "fwd", False, (small * large) ** 0.5) == pytest.approx(300e12)  # halfway in log
    assert curves.rate("k", "fwd", False, large * 100) == pytest.approx(400e12)  # flat beyond
    with pytest.raises(KeyError, match="no one-GPU measurements"):
        curves.rate("other", "fwd", False, small)


def test_free_communication_keeps_a_balanced_ring_at_the_kernel_rate():
    curves = _curves({1024: 500.0, 65536: 500.0})
    free = cpm.Params(a2a_gbs=1e9, p2p_gbs=1e9, merge_bytes=0, step_us=0, copy_gbs=1e12)
    model = cpm.Model(curves, free)
    for pass_ in ("fwd", "fwd_bwd"):
        p = cpm.Problem(1, 65536, 8, 8, causal=False, pass_=pass_)
        assert model.tflops("ring", "k", p, 4) == pytest.approx(500, rel=1e-6)
        assert model.tflops("ulysses", "k", p, 4) == pytest.approx(500, rel=1e-6)
    causal = cpm.Problem(1, 65536, 8, 8, causal=True)
    # contiguous ring: rank N-1 computes N-1 full blocks and its diagonal while rank 0 waits; zigzag balances
    assert model.tflops("zigzag", "k", causal, 4) == pytest.approx(500, rel=0.01)
    # per device 1/4 of S^2/2 pairs; the slowest rank 3 full s x s blocks and a diagonal: 2 s^2 / 3.5 s^2
    assert model.tflops("ring", "k", causal, 4) == pytest.approx(500 * 2 / 3.5, rel=0.01)
    # Ulysses' re-layout copies (two per tensor, read + write) cost time at the device's copy bandwidth
    p = cpm.Problem(1, 65536, 8, 8)
    slow_copies = cpm.Model(curves, replace(free, copy_gbs=1000.0))
    extra_ms = slow_copies.predict_ms("ulysses", "k", p, 4) - model.predict_ms("ulysses", "k", p, 4)
    tensor = 65536 // 4 * 8 * 128 * 2  # bytes of q (and of k, v, out) per rank
    assert extra_ms == pytest.approx(4 * 4 * tensor / 1000e9 * 1e3, rel=1e-3)


def test_slow_links_and_exposed_transfers_cost_time():
    curves = _curves({1024: 500.0, 65536: 500.0})
    base = cpm.Params(a2a_gbs=1e9, p2p_gbs=1e9, merge_bytes=0, step_us=0)
    p = cpm.Problem(1, 16384, 8, 8, pass_="fwd_bwd")
    fast = cpm.Model(curves, base).predict_ms("ring", "k", p, 4)
    slow_ring = cpm.Model(curves, replace(base, p2p_gbs=10)).predict_ms("ring", "k", p, 4)
    slow_a2a = cpm.Model(curves, replace(base, a2a_gbs=10)).predict_ms("ulysses", "k", p, 4)
    assert slow_ring > fast and slow_a2a > cpm.Model(curves, base).predict_ms("ulysses", "k", p, 4)
    inter = cpm.Model(curves, replace(base, node_size=2)).predict_ms("ring", "k", p, 4)  # ring crosses nodes
    assert inter > fast
    with pytest.raises(ValueError, match="multiples of 16"):
        cpm.Model(curves, base).predict_ms("ulysses", "k", p, 16)


def test_cp_model_command_fits_checks_and_predicts():
    from attnbench.cli import app
    res = CliRunner().invoke(app, [
        "cp-model", "--kernels", str(ROOT / "docs/results/raw/h200-2026-11-23/cp-model/local_kernels_h200.csv"),
        "--fit", str(ROOT / "docs/results/raw/h200x2-2026-11-22/seed001_tables.csv"),
        "--check", str(ROOT / "docs/results/raw/h200x2-2026-11-22/cp_p4.csv"), "--gpus", "2,16", "--seq-lens", "128k"])
    assert res.exit_code == 0, res.output
    assert "check: predicted vs measured" in res.output and "within 5%" in res.output
    assert "predicted TF/s per device" in res.output and "ring-flash-attn" in res.output


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "two"], "bad --gpus 'two'"),
    (["--gpus", "2,,8"], "empty item between commas"),
    (["--q-heads", "32", "--kv-heads", "5"], "query heads a multiple of K/V heads"),
    (["--kernels", "/nonexistent.csv"], "/nonexistent.csv: no such file"),
    (["--kernel", "nope"], "no one-GPU measurements of kernel 'nope'"),
])
def test_cp_model_bad_input_is_one_line(argv, message, capsys, monkeypatch):
    from attnbench.cli import main
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main(["cp-model", *argv])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("attnbench: error:") and message in err and "\n" not in err


def test_twins_pair_only_methods_that_do_the_same_work():
    full = cpm.Problem(1, 16384, 32, 32, causal=False)
    causal = replace(full, causal=True)
    rows = [cpm.Measured("ring", "k", 2, full, 500.0), cpm.Measured("zigzag", "k", 2, full, 490.0),
            cpm.Measured("ring", "k", 2, causal, 300.0), cpm.Measured("zigzag", "k", 2, causal, 450.0),
            cpm.Measured("ulysses", "k", 2, full, 520.0), cpm.Measured("usp", "k", 2, full, 515.0),
            cpm.Measured("ulysses", "k", 16, full, 400.0), cpm.Measured("usp", "k", 16, full, 410.0)]
    pairs = {(a.method, b.method, a.n, a.problem.causal) for a, b in cpm.twins(rows)}
    # a causal mask makes ring and zigzag differ; on 16 GPUs USP keeps a ring of 2 (Ulysses inside 8-GPU nodes)
    assert pairs == {("ring", "zigzag", 2, False), ("ulysses", "usp", 2, False)}


def _links_doc(p2p_ms: dict[int, float], a2a_ms: dict[int, float]) -> dict:
    rows = [{"kind": "p2p", "bytes": b, "counted_bytes": b, "median_ms": t} for b, t in p2p_ms.items()]
    rows += [{"kind": "a2a", "bytes": b, "counted_bytes": b / 2, "median_ms": t} for b, t in a2a_ms.items()]
    fit = {k: {"gbs": 100.0, "latency_us": 10.0} for k in ("p2p", "a2a")}
    return {"rows": rows, "fit": fit}


def test_measured_links_are_read_off_their_sizes():
    doc = _links_doc({1000: 0.01, 1_000_000: 0.04, 100_000_000: 1.0}, {1000: 0.01, 1_000_000: 0.05})
    params = cpm.with_links(cpm.Params(), doc, "test")
    p2p = params.p2p_link
    assert cpm._transfer_ms(10, p2p) == pytest.approx(0.01)            # below the smallest: its time
    assert cpm._transfer_ms(1_000_000, p2p) == pytest.approx(0.04)     # a measured size: its time
    assert cpm._transfer_ms(10_000_000, p2p) == pytest.approx(0.2)     # halfway in log-log between 0.04 and 1.0
    assert cpm._transfer_ms(200_000_000, p2p) == pytest.approx(1.0 + 100e6 / 100e9 * 1e3)  # beyond: at gbs
    assert params.a2a_link.curve[-1] == (500_000, 0.05)                # the bytes that cross, not the tensor's
    with pytest.raises(ValueError, match="no a2a measurements"):
        cpm.with_links(cpm.Params(), {"rows": doc["rows"][:3], "fit": doc["fit"]}, "test")


def test_fit_keeps_measured_links_and_fits_the_rest():
    curves = _curves({1024: 500.0, 65536: 500.0})
    rows = [cpm.Measured("ring", "k", 2, cpm.Problem(1, 16384, 8, 8, pass_="fwd_bwd"), 400.0)]
    base = cpm.with_links(cpm.Params(), _links_doc({1000: 0.01, 10**9: 5.0}, {1000: 0.01, 10**9: 5.0}), "t")
    fitted = cpm.fit(curves, rows, base, free=("merge_bytes", "step_us"))
    assert fitted.p2p_link == base.p2p_link and fitted.a2a_gbs == base.a2a_gbs
    assert (fitted.merge_bytes, fitted.step_us) != (base.merge_bytes, base.step_us)


def test_cp_model_uses_the_measured_links_by_default_and_can_fit_them():
    from attnbench.cli import app
    args = ["cp-model", "--gpus", "2", "--seq-lens", "128k"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "links inside a node: measured" in " ".join(res.output.split())
    fitted = CliRunner().invoke(app, [*args, "--fit-links"])
    assert fitted.exit_code == 0 and "(fitted)" in fitted.output


def test_cp_model_refuses_a_file_that_is_not_a_links_file(tmp_path, capsys, monkeypatch):
    from attnbench.cli import main
    monkeypatch.chdir(ROOT)
    for text in ('{"rows": []}', "not json"):
        bad = tmp_path / "links.json"
        bad.write_text(text)
        with pytest.raises(SystemExit) as exc:
            main(["cp-model", "--links", str(bad)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and "not a file written by `attnbench links --output`" in err and "\n" not in err


# ---- a fit that cannot be made says so; bandwidths are held to what a device can do --------------------
def _link_rows(times_ms: dict[int, float], kind: str = "p2p") -> list[dict]:
    return [{"kind": kind, "bytes": b, "counted_bytes": b, "median_ms": t, "gbs": b / (t * 1e-3) / 1e9}
            for b, t in times_ms.items()]


def test_links_fit_reports_what_it_cannot_fit_instead_of_a_number():
    from attnbench import plausibility
    from attnbench.distributed import links as lk
    h100 = plausibility.Ceilings(989.0, 3350.0, "H100: datasheet")
    good = lk.fit(_link_rows({4096: 0.02, 2**30: 3.0}), h100)["p2p"]
    assert good["gbs"] == pytest.approx(2**30 / (2.98e-3) / 1e9) and "unfitted" not in good
    flat = lk.fit(_link_rows({4096: 1.0, 2**30: 1.0}), h100)["p2p"]  # the old fit divided by 1e-9 ms: 1e18 GB/s
    assert flat["gbs"] is None and "took no longer than the smallest" in flat["unfitted"]
    faster = lk.fit(_link_rows({4096: 1.0, 2**30: 0.5}), h100)["p2p"]
    assert faster["gbs"] is None and faster["latency_us"] == pytest.approx(1000.0)
    one = lk.fit(_link_rows({4096: 0.02}), h100)["p2p"]
    assert one["gbs"] is None and "two" in one["unfitted"]
    too_fast = lk.fit(_link_rows({4096: 0.02, 2**32: 0.5}), h100)["p2p"]  # 8.6 TB/s over a 3.35 TB/s memory
    assert too_fast["gbs"] is None and "above the device's memory bandwidth, 3,350 GB/s" in too_fast["unfitted"]
    rows = lk.mark_implausible(_link_rows({4096: 0.02, 2**32: 0.5}), h100)
    assert rows[0]["gbs"] is not None and rows[1]["gbs"] is None and "3,350 GB/s" in rows[1]["implausible"]


def test_links_bandwidth_ceiling_follows_the_device():
    from attnbench.distributed import links as lk
    assert lk.ceiling_for("NVIDIA H100 80GB HBM3").gbps < lk.ceiling_for("Some Future GPU").gbps
    assert lk.bandwidth_problem(float("nan"), lk.ceiling_for("x")) and lk.bandwidth_problem(0.0, lk.ceiling_for("x"))
    assert lk.bandwidth_problem(400.0, lk.ceiling_for("NVIDIA H100 80GB HBM3")) is None


def test_a_fit_with_no_finite_error_is_refused_not_reported():
    curves = _curves({1024: 500.0, 65536: 500.0})
    rows = [cpm.Measured("ulysses", "k", 16, cpm.Problem(1, 16384, 8, 8), 400.0)]  # 8 heads over 16 ranks: no layout
    with pytest.raises(cpm.FitFailed, match="nothing fitted"):
        cpm.fit(curves, rows)
    assert cpm.at_grid_edge(replace(cpm.Params(), step_us=0.0), ("step_us", "merge_bytes")) == ["step_us"]


def _hostile_links(tmp_path, change) -> Path:
    import json
    doc = json.loads((ROOT / "docs/results/raw/h200x2-2026-11-24/links.json").read_text())
    change(doc)
    path = tmp_path / "links.json"
    path.write_text(json.dumps(doc))
    return path


def _p2p_rows(doc, **values):
    for r in doc["rows"]:
        if r["kind"] == "p2p":
            r.update(values)


@pytest.mark.parametrize("change, needle", [
    (lambda d: d["fit"]["p2p"].update(gbs=0), "gbs 0 is not in"),
    (lambda d: d["fit"]["p2p"].update(gbs=-5), "gbs -5 is not in"),
    (lambda d: d["fit"]["p2p"].update(gbs=float("nan")), "gbs nan is not in"),
    (lambda d: d["fit"]["p2p"].update(gbs=1e15), "above the device's memory bandwidth"),
    (lambda d: d["fit"]["p2p"].update(gbs=None, unfitted="the largest message took no longer"), "cannot be fitted"),
    (lambda d: _p2p_rows(d, median_ms=0), "median_ms 0 is not in"),
    (lambda d: _p2p_rows(d, median_ms="abc"), "median_ms 'abc' is not a number"),
    (lambda d: _p2p_rows(d, median_ms=1.0), "took no longer than the smallest"),
])
def test_cp_model_refuses_links_it_cannot_use(tmp_path, capsys, monkeypatch, change, needle):
    from attnbench.cli import main
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main(["cp-model", "--links", str(_hostile_links(tmp_path, change)), "--gpus", "2", "--seq-lens", "128k"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and needle in err and "\n" not in err, err


def _hostile_csv(tmp_path, source: str, change) -> Path:
    import csv
    with open(ROOT / source, newline="") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0])
    rows, fields = change(rows, fields)
    path = tmp_path / "hostile.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


KERNELS = "docs/results/raw/h200-2026-11-24/cp-model/local_kernels_h200.csv"
FIT = "docs/results/raw/h200x2-2026-11-22/seed001_tables.csv"


@pytest.mark.parametrize("flag, source, change, needle", [
    ("--kernels", KERNELS, lambda r, f: ([dict(x, median_ms="0") for x in r], f), "median_ms '0' is not in"),
    ("--kernels", KERNELS, lambda r, f: ([dict(x, median_ms="-1") for x in r], f), "median_ms '-1' is not in"),
    ("--kernels", KERNELS, lambda r, f: ([dict(x, median_ms="nan") for x in r], f), "median_ms 'nan' is not in"),
    ("--kernels", KERNELS, lambda r, f: (r, [c for c in f if c != "heads"]), "heads None is not an integer"),
    ("--kernels", KERNELS, lambda r, f: ([dict(x, median_ms="1e-12") for x in r], f), "above what any GPU does"),
    ("--kernels", KERNELS, lambda r, f: ([dict(x, kernel="other" if x["kernel"] == "cudnn" else x["kernel"])
                                          for x in r], f), "which"),
    ("--fit", FIT, lambda r, f: ([dict(x, tflops="0") for x in r], f), "tflops '0' is not in"),
    ("--fit", FIT, lambda r, f: ([dict(x, tflops="nan") for x in r], f), "tflops 'nan' is not in"),
    ("--fit", FIT, lambda r, f: ([dict(x, tflops="1e30") for x in r], f), "above what any GPU does"),
    ("--fit", FIT, lambda r, f: ([dict(x, batch="x") for x in r], f), "batch 'x' is not an integer"),
])
def test_cp_model_refuses_measurements_that_are_not_measurements(tmp_path, capsys, monkeypatch, flag, source, change,
                                                                   needle):
    from attnbench.cli import main
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main(["cp-model", flag, str(_hostile_csv(tmp_path, source, change)), "--gpus", "2", "--seq-lens", "128k"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and needle in err and "\n" not in err and "Error:" not in err, err


def test_cp_model_inputs_are_bounded_by_size(tmp_path, capsys, monkeypatch):
    from attnbench.cli import main
    from attnbench.results import files
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(files, "MAX_LINKS_BYTES", 1000)
    with pytest.raises(SystemExit) as exc:
        main(["cp-model", "--gpus", "2", "--seq-lens", "128k"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "more than such a file ever needs" in err, err

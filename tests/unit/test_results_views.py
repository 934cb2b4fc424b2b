"""Plots, the HTML report (rendered in headless Chromium) and exports, from real and synthetic runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from results_fixtures import CPU_RUN, HOSTILE, SYNTH_RUN, attnbench, cli, make_cpu_run, make_synthetic_run

from attnbench.report import plots
from attnbench.results import export
from attnbench.results.store import ResultStore


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("views") / "results.db"
    make_cpu_run(path)
    make_synthetic_run(path)
    return path


@pytest.fixture(scope="module")
def cpu_rows(db):
    with ResultStore(db) as store:
        return store.rows(CPU_RUN)


@pytest.fixture(scope="module")
def synth_rows(db):
    with ResultStore(db) as store:  # the sparsity runs together
        return [r for r in store.rows() if r["run_id"].startswith(SYNTH_RUN)]


CPU_X = ("seq_len", "num_seqs", "head_size", "emb_dim", "heads")


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_every_x_axis_plots_from_a_cpu_run(cpu_rows, tmp_path):
    for x in CPU_X:
        (png,) = plots.save(cpu_rows, x, "ms", tmp_path / f"ms-{x}.png")
        assert _is_png(png)


def test_every_y_axis_plots_as_png_and_svg(cpu_rows, tmp_path):
    for y in ("tflops", "gbps"):
        png, svg = plots.save(cpu_rows, "seq_len", y, tmp_path / f"{y}-seq")
        assert (png.name, svg.name) == (f"{y}-seq.png", f"{y}-seq.svg") and _is_png(png)
        text = svg.read_text()
        label = plots.y_label(y, plots.rate_unit(cpu_rows))  # a CPU run's rates: GFLOP/s
        assert "<svg" in text and "sequence length (tokens)" in text and label in text


def test_memory_and_sparsity_plot_from_recorded_values(synth_rows, tmp_path):
    for y in ("ms", "mem"):
        (path,) = plots.save(synth_rows, "sparsity", y, tmp_path / f"sp-{y}.png")
        assert _is_png(path)
    (svg,) = plots.save(synth_rows, "seq_len", "mem", tmp_path / "mem.svg")
    assert "peak memory (MiB)" in svg.read_text()
    # memory in MiB: 1024 tokens -> 2**26 bytes = 64 MiB
    pts = plots.points(synth_rows, "seq_len", "mem")
    assert {p["_y"] for p in pts if p["_x"] == 1024} == {64.0}


def _calm(rows: list[dict]) -> list[dict]:
    """The rows as if the CPU had been idle: how busy this machine was must not decide what a layout test
    sees."""
    out = []
    for r in rows:
        info = json.loads(r["info"] or "{}")
        info.pop("cpu", None)
        out.append(dict(r, info=json.dumps(info)))
    return out


def test_panels_split_pass_and_causal_and_lines_per_backend(cpu_rows):
    cpu_rows = _calm(cpu_rows)
    data = plots.panels(plots.points(cpu_rows, "seq_len", "ms"), "seq_len")
    assert set(data) == {(0, "fwd"), (1, "fwd"), (0, "fwd_bwd"), (1, "fwd_bwd")}
    # grouped cases and other head sizes sit at the same x: they get their own lines, named alike in
    # every panel; the causal fwd_bwd panel holds only the plain length sweep, one line per backend
    causal_bwd = data[(1, "fwd_bwd")]
    assert set(causal_bwd) == {"naive n1 h2 d8", "sdpa-flash n1 h2 d8"}
    assert [x for x, _ in causal_bwd["naive n1 h2 d8"]] == [16, 33, 64]
    fwd = data[(0, "fwd")]
    assert {"naive n2 h2 d8", "naive n1 h2 d16", "naive n1 h4 d8"} <= set(fwd) and "sdpa-flash n2 h2 d8" not in fwd
    # a sweep over one axis alone gets plain backend names
    plain = plots.panels(plots.points([r for r in cpu_rows if r["causal"]], "seq_len", "ms"), "seq_len")
    assert set(plain[(1, "fwd")]) == {"naive", "sdpa-flash"}


def test_plot_says_why_it_cannot_draw(cpu_rows):
    with pytest.raises(ValueError, match="not measured on CPU"):
        plots.points(cpu_rows, "seq_len", "mem")
    with pytest.raises(ValueError, match="sparse backends"):
        plots.points(cpu_rows, "sparsity", "ms")
    with pytest.raises(ValueError, match="allowed: seq_len"):
        plots.points(cpu_rows, "batch", "ms")


def test_plot_cli_writes_both_formats_and_reports_errors_in_one_line(db, tmp_path):
    res = attnbench("plot", "--db", db, "--run", CPU_RUN, "--x", "seq_len", "--y", "ms,tflops", "-o",
                    tmp_path / "fig", "--backend", "naive", "--pass", "fwd")
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fig-ms.png", "fig-ms.svg", "fig-tflops.png", "fig-tflops.svg"]
    assert "sdpa-flash" not in (tmp_path / "fig-ms.svg").read_text()
    res = cli("plot", "--db", db, "--run", CPU_RUN, "--x", "seq_len", "--y", "mem", "-o", tmp_path / "m.png")
    assert res.returncode == 2 and "not measured on CPU" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "m.png").exists()
    res = cli("plot", "--db", db, "--run", "no-such-run", "--x", "seq_len", "--y", "ms")
    assert res.returncode == 2 and "no run 'no-such-run'" in res.stderr


# ---- HTML report in a real browser -----------------------------------------------------------------
def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("Chromium is not installed (Debian: apt-get install chromium); .ci/run installs it")


def _chrome(binary, profile, *args):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium(db, tmp_path):
    binary = _chromium()
    out = tmp_path / "report.html"
    res = cli("report", "--db", db, "--run", CPU_RUN, SYNTH_RUN, "-o", out)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "report must not load anything"
    shot = tmp_path / "shot.png"
    render = _chrome(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000", "--dump-dom",
                     out.as_uri())
    assert shot.is_file(), render.stderr[-2000:]
    dom = render.stdout
    if "<html" not in dom:  # Chromium versions that do one thing per call
        dom = _chrome(binary, tmp_path / "profile2", "--dump-dom", out.as_uri()).stdout
    import matplotlib.image

    pixels = np.asarray(matplotlib.image.imread(shot))[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    assert pixels.std() > 0.05, "screenshot is blank"
    assert (pixels.mean(axis=2) < 0.5).mean() > 0.005, "hardly any dark (text) pixels"
    assert dom.count('<table class="results"') == 2 and dom.count('<table class="pivot"') >= 2
    assert len(re.findall(r'<img [^>]*src="data:image/svg\+xml,', dom)) >= 4  # SVG, %-escaped (no base64)
    assert "b1 s33 h2 d8 fp32 causal" in dom and "sparse-test" in dom
    assert '<table class="accuracy"' in dom and '<table class="correct"' in dom
    assert "<td class=\"num\">0.00100</td>" in dom  # accuracy in numbers (a max abs error of 0.001), not dicts
    assert "max_abs=" not in dom
    # what did not run, grouped by reason: sdpa-flash has no varlen path; the hostile reason stays text
    assert '<table class="skipped"' in dom and "varlen" in dom
    assert "<script>alert" not in dom and "&lt;script&gt;alert" in dom
    assert dom.index('class="pivot"') < dom.index("<img ")  # the answer comes before the figures


def test_a_long_command_folds_on_the_run_line():
    """A grouped sweep's command (256 sequences spelled out: 2,258 characters) ran past the page's right edge."""
    from attnbench.report.html import COMMAND_SHOWN, command_html
    short = "attnbench run --seq-lens 128 <x>"
    assert command_html(short) == "<code>attnbench run --seq-lens 128 &lt;x&gt;</code></p>"
    long = "attnbench run --seq-lens " + ",".join(["128"] * 256)
    html = command_html(long)
    line, fold = html.split("</p>")
    assert line == f"<code>{long[:COMMAND_SHOWN]}…</code>"
    assert fold.startswith('<details class="command"><summary>the whole command (1,048 characters)</summary>')
    assert f"<code>{long}</code></details>" in fold


def test_the_reports_speedups_are_against_the_runs_own_baseline(tmp_path):
    from results_fixtures import synthetic_record

    from attnbench.report import html
    from attnbench.spec import AttnSpec
    db = tmp_path / "b.db"
    with ResultStore(db) as store:
        for run_id, config in (("given", {"baseline": "sdpa-math"}), ("none", {}), ("gone", {"baseline": "fa3"})):
            store.start_run(run_id, command="attnbench run", config=config, env_id=None, version="t")
            for s in (64, 128):
                spec = AttnSpec(seqlens_q=(s,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")
                for backend, ms in (("naive", 2.0), ("sdpa-math", 1.0)):
                    store.write(synthetic_record(run_id, spec, backend, [ms, ms * 1.01, ms * 0.99]))
            store.finish_run(run_id)
    with ResultStore(db, readonly=True) as store:
        page = html.build(store, ["given", "none", "gone"])
    heads = re.findall(r"<h3>Speedup over ([^ ]+) ", page)
    assert heads == ["sdpa-math", "naive", "naive"]  # the run's --baseline; else the first plain kernel it ran


def test_report_escapes_everything(synth_rows):
    from attnbench.report import html_tables
    from attnbench.results.record import Record
    records = [Record.from_row(r) for r in synth_rows]
    for table in (html_tables.not_run(records), html_tables.records_html(records)):
        assert HOSTILE not in table and "&lt;script&gt;" in table and "&quot;quoted&quot;" in table


# ---- export ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_export_round_trips(db, cpu_rows, tmp_path, fmt):
    out = tmp_path / f"x.{fmt}"
    res = cli("export", "--db", db, "--run", CPU_RUN, "--format", fmt, "-o", out)
    assert res.returncode == 0, res.stderr
    back = export.read(out)
    assert back == export.export_rows(cpu_rows)
    assert len(back) == len(cpu_rows) and any(r["status"] == "unsupported" for r in back)


def test_export_filters_and_stdout(db):
    res = cli("export", "--db", db, "--run", CPU_RUN, "--format", "json", "--backend", "sdpa-flash",
                    "--status", "unsupported")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == 2 and {(r["backend"], r["status"], r["num_seqs"]) for r in rows} == {
        ("sdpa-flash", "unsupported", 2), ("sdpa-flash", "unsupported", 3)}
    res = cli("export", "--db", db, "--status", "bogus")
    assert res.returncode == 2 and "unknown --status 'bogus'" in res.stderr


def test_parquet_needs_pyarrow_or_round_trips(db, cpu_rows, tmp_path):
    out = tmp_path / "x.parquet"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        res = cli("export", "--db", db, "--run", CPU_RUN, "--format", "parquet", "-o", out)
        assert res.returncode == 2 and "pip install pyarrow" in res.stderr and not out.exists()
        return
    export.write(cpu_rows, out, "parquet")
    assert export.read(out) == export.export_rows(cpu_rows)


def test_sparsity_runs_join_into_lines_per_length():
    # one run per target sparsity; the achieved sparsity differs per length, so no two points share an x
    rows = [{"status": "ok", "backend": "sparse", "pass": "fwd", "causal": 0, "run_id": f"sp-{t}", "seq_len": s,
             "num_seqs": 1, "heads_q": 4, "head_dim": 64, "median_ms": t * s, "info": json.dumps({"sparsity": t + s / 1e5}),
             "accuracy": json.dumps({"verdict": "approx-pass"})}
            for t in (0.25, 0.5, 0.75) for s in (1024, 4096)]
    data = plots.panels(plots.points(rows, "sparsity", "ms"), "sparsity")
    assert {k: len(v) for k, v in data[(0, "fwd")].items()} == {"sparse s1024": 3, "sparse s4096": 3}


def test_failed_and_unchecked_cases_are_drawn_marked_never_dropped_or_mixed(tmp_path):
    base = {"backend": "k", "pass": "fwd", "causal": 0, "run_id": "r", "num_seqs": 1, "heads_q": 4, "head_dim": 64}
    rows = [dict(base, status="ok", seq_len=s, median_ms=1.0, accuracy=json.dumps({"verdict": "pass"}))
            for s in (128, 256)]
    rows += [dict(base, status="mismatch", seq_len=512, median_ms=2.0, accuracy=json.dumps({"verdict": "fail"})),
             dict(base, status="ok", seq_len=1024, median_ms=3.0, accuracy=json.dumps({"verdict": "approx-fail"})),
             dict(base, status="ok", seq_len=2048, median_ms=4.0, accuracy=None),
             dict(base, status="nan", seq_len=4096, median_ms=None, accuracy=None)]
    lines = plots.panels(plots.points(rows, "seq_len", "ms"), "seq_len")[(0, "fwd")]
    assert lines == {"k": [(128, 1.0), (256, 2 * 0.5)], "k [failed check]": [(512, 2.0), (1024, 3.0)],
                     "k [unchecked]": [(2048, 4.0)]}
    assert _is_png(plots.save(rows, "seq_len", "ms", tmp_path / "m.png")[0])
    items = export.export_rows(rows)
    assert [i["verdict"] for i in items] == ["pass", "pass", "fail", "approx-fail", "unchecked", "nan"]


def test_the_correctness_table_says_how_many_cases_were_judged_approximately():
    from attnbench.report import html_tables
    from attnbench.results.record import Record
    from attnbench.spec import AttnSpec

    def rec(backend, verdict, exact, name=None):
        info = {"exact": exact} | ({"batch_name": name} if name else {})
        return Record(run_id="r", backend=backend, spec=AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16),
                      median_ms=1.0, accuracy={"verdict": verdict}, info=info)
    records = [rec("fa3", "pass", True), rec("fa3", "pass", True), rec("fa3", "approx-pass", False, name="step 7"),
               rec("sage", "approx-pass", False), rec("naive", "pass", True)]
    table = html_tables.correctness(records)
    assert "<td>exact (1 of 3 approximately)</td>" in table
    assert "<td>approximate</td>" in table and "<td>exact</td>" in table


def test_a_pivot_with_one_untitled_group_has_no_empty_column():
    from results_fixtures import synthetic_record

    from attnbench.report import html_tables, summary
    from attnbench.spec import AttnSpec
    spec = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16, dtype="fp32", causal=True)
    records = [synthetic_record("p", spec.replace(pass_=p), b, [1.0, 1.1]) for p in ("fwd", "fwd_bwd")
               for b in ("naive", "sdpa-math")]
    built = summary.build(records)
    assert all(not g.title for pivot in built.pivots for g in pivot.groups)  # the case's axes all fixed: no groups
    html = html_tables.pivot_html(built)
    head = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
    assert re.findall(r"<th[^>]*>(.*?)</th>", head) == ["pass", "naive", "sdpa-math"]

"""Figures as a reader compares them: readable log ticks, the CI drawn, lines that join only like cases and
are named as the tables name them, and no figure where there is no line to draw."""

from __future__ import annotations

import json

import pytest

from attnbench.report import html, plots, styles


def row(backend="naive", seq=128, *, keys=None, heads=4, kv=4, ms=1.0, ci=None, n=20, busy=False, **extra) -> dict:
    info = {"exact": True}
    if ci is not None:
        info["median_ci95_ms"] = ci
    if busy:
        info["cpu"] = {"busy": True}
    return {"status": "ok", "backend": backend, "pass": "fwd", "causal": 0, "run_id": "r", "seq_len": seq,
            "seq_len_k": keys or seq, "num_seqs": 1, "batch": 1, "heads_q": heads, "heads_kv": kv, "head_dim": 64,
            "head_dim_v": 64, "dtype": "fp32", "median_ms": ms, "tflops": 1.0 / ms, "n": n,
            "accuracy": json.dumps({"verdict": "pass"}), "info": json.dumps(info), **extra}


def test_log_time_axes_are_ticked_1_2_5_with_plain_numbers():
    rows = [row(seq=s, ms=0.003 * s) for s in (128, 256, 512, 1024, 2048, 4096)]  # 0.38 .. 12 ms
    fig = plots.figure(rows, "seq_len", "ms")
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    low, high = ax.get_ylim()
    shown = [float(t) for t in labels if low <= float(t) <= high]
    assert {0.5, 1, 2, 5, 10} <= set(shown), labels
    assert not any("10^" in t or "times" in t or "{" in t for t in labels), labels  # not 2x10^-1
    assert styles.plain_number(0.2) == "0.2" and styles.plain_number(2e-5) == "2e-5"


def test_the_ci_of_each_median_is_a_band_and_the_figure_says_so():
    rows = [row(seq=s, ms=s / 100, ci=[s / 110, s / 90]) for s in (128, 256, 512)]
    fig = plots.figure(rows, "seq_len", "tflops")
    ax = fig.axes[0]
    band, = ax.collections  # one band, for the one line
    lows = band.get_paths()[0].vertices[:, 1]
    assert min(lows) == pytest.approx(1e3 / (512 / 90))  # a rate's band: the inverse of the time's (in GFLOP/s)
    assert plots.SPREAD_NOTE in [t.get_text() for t in fig.texts]
    no_ci = plots.figure([row(seq=s) for s in (128, 256)], "seq_len", "ms")
    assert not no_ci.axes[0].collections and plots.SPREAD_NOTE not in [t.get_text() for t in no_ci.texts]


def test_lines_join_like_cases_only_and_are_named_as_tables_name_them():
    rows = [row(seq=100), row(seq=256),                       # the same shape at two lengths: one line
            row(seq=77, keys=300),                            # queries shorter than keys: a line of its own
            row(seq=577, kv=2)]                               # GQA: named h4/2, as the tables write it
    lines = plots.panels(plots.points(rows, "seq_len", "ms"), "seq_len")[(0, "fwd")]
    assert sorted(len(v) for v in lines.values()) == [1, 1, 2]
    assert "naive keys≠queries h4/4" in lines and "naive keys=queries h4/2" in lines
    assert not any("kv2" in label for label in lines)


def test_cases_timed_on_a_busy_cpu_stay_on_their_line_marked_as_the_tables_mark_them():
    rows = [row(seq=128), row(seq=256, busy=True), row(seq=512)]
    pts = plots.points(rows, "seq_len", "ms")
    assert plots.panels(pts, "seq_len")[(0, "fwd")] == {"naive": [(128, 1.0), (256, 1.0), (512, 1.0)]}
    assert plots.busy_points(pts, "seq_len") == {(0, "fwd"): [("naive", 256, 1.0)]}
    fig = plots.figure(rows, "seq_len", "ms")
    marks = [t for t in fig.axes[0].texts if t.get_text() == "?"]
    assert len(marks) == 1 and marks[0].xy == (256, 1.0)
    assert [h.get_text() for h in fig.legends[0].get_texts()] == ["naive"]  # one legend item, unbroken
    assert any(plots.BUSY_NOTE in t.get_text() for t in fig.texts)
    assert not any("?" in t.get_text() for t in plots.figure(rows[:1] + rows[2:], "seq_len", "ms").texts)


def test_legend_items_keep_apart_in_a_wider_font():
    # a browser draws the SVG's text in the first font it has (DejaVu Sans, else Verdana, about 15% wider):
    # each item's text, so widened, still ends before the next item's line begins
    names = ["naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "flex", "fa2-varlen-qkvpacked", "fa3"]
    rows = [row(b, seq=s, ms=1.0 + i, accuracy=json.dumps({"verdict": "fail"}) if i % 2 else None)
            for i, b in enumerate(names) for s in (128, 256)]
    fig = plots.figure(rows, "seq_len", "ms")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0]
    rows_of: dict = {}
    for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True):
        box = text.get_window_extent(renderer)
        rows_of.setdefault(round(box.y0), []).append((box, handle.get_window_extent(renderer)))
    assert max(map(len, rows_of.values())) > 1  # columns to keep apart
    for items in rows_of.values():
        items.sort(key=lambda item: item[1].x0)
        for (text, _), (_, handle) in zip(items, items[1:], strict=False):
            assert text.x0 + 1.15 * text.width < handle.x0, (text, handle)


def test_an_axis_with_one_value_is_no_figure():
    rows = [row(seq=s) for s in (128, 256)]
    why = plots.one_value(rows, "head_size")
    assert why == "--x head_size takes one value here (64): no line to draw; axes that vary: seq_len"
    assert plots.one_value(rows, "seq_len") is None


def test_a_run_that_timed_each_case_once_gets_no_figures():
    once = [row(seq=100, n=1), row(seq=77, keys=300, n=1)]
    assert html.timed_once(once) and not html.timed_once([row(seq=100, n=1), row(seq=256, n=30)])
    section = html.run_section({"run_id": "v", "status": "done"}, [_store_row(r) for r in once], None)
    assert "<img" not in section and "Every case was timed once" in section
    assert "Fastest kernel per shape" not in section  # one cold call per case is no speed to compare


def _store_row(r: dict) -> dict:
    """A ``ResultStore.rows`` row of ``r`` (the report reads records back from rows)."""
    from attnbench.results.record import Record
    from attnbench.spec import AttnSpec
    spec = AttnSpec(batch=1, seqlens_q=(r["seq_len"],), seqlens_k=(r["seq_len_k"],), heads_q=4, head_dim=64,
                    dtype="fp32", pass_="fwd")
    record = Record(run_id="v", backend=r["backend"], spec=spec, median_ms=r["median_ms"], n=r["n"],
                    tflops=r["tflops"], accuracy=json.loads(r["accuracy"]), info=json.loads(r["info"]))
    return record.to_row()


def _batch_row(backend, seqlens_q, seqlens_k, ms, **fields):
    from attnbench.results.record import Record
    from attnbench.spec import AttnSpec
    spec = AttnSpec(seqlens_q=seqlens_q, seqlens_k=seqlens_k, heads_q=4, head_dim=16, dtype="fp32", causal=True,
                    **fields)
    r = Record(run_id="r", backend=backend, spec=spec, median_ms=ms, tflops=1.0 / ms, status="ok",
               accuracy={"verdict": "pass"}, info={"exact": True})
    return r.to_row()


def test_serving_batches_are_drawn_against_their_tokens_not_their_longest_request():
    steps = [((1, 1, 5), (40, 33, 60)), ((1, 1, 1, 1), (41, 34, 61, 90)), ((64, 1), (64, 35))]
    rows = [_batch_row(b, q, k, ms) for b in ("naive", "sdpa-math") for (q, k), ms in zip(steps, (1.0, 2.0, 3.0))]
    assert plots.plot_axes(rows) == ["new_tokens", "kv_tokens"]
    pts = plots.points(rows, "kv_tokens", "ms")
    assert sorted({p["_x"] for p in pts}) == [99.0, 133.0, 226.0]  # each batch's keys, summed over its requests
    assert len(plots.panels(pts, "kv_tokens")) == 1
    (lines,) = plots.panels(pts, "kv_tokens").values()
    assert sorted(lines) == ["naive", "sdpa-math"]  # one line a backend, not one a request count


def test_grouped_whole_sequences_keep_their_sizes_as_axes():
    rows = [_batch_row("naive", (128,) * n, (128,) * n, float(n)) for n in (1, 2, 4)]
    assert "num_seqs" in plots.plot_axes(rows) and "new_tokens" not in plots.plot_axes(rows)

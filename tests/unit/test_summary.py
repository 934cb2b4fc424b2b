"""What a user reads: the run summary pivot, the verify grid, progress lines, figures split for reading."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from attnbench.report import grid, plots, styles, summary
from attnbench.results.record import Record
from attnbench.spec import AttnSpec

EXACT = ["naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-varlen", "fa2", "fa2-qkvpacked",
         "fa2-kvpacked", "fa2-varlen", "fa2-varlen-qkvpacked", "fa3", "fa3-varlen", "flex"]
APPROX = ["sage", "sage-varlen", "sage2-fp8", "sage2-fp8-sm90", "sage2-fp16", "sparge", "sparge-cdf", "sparge-fp16",
          "sparge-fp16-cdf"]
LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def rec(backend: str, seq: int, causal: bool, pass_: str, tflops: float | None, *, exact: bool = True,
        verdict: str | None = None, status: str = "ok", reason: str | None = None, dropped: bool = False) -> Record:
    spec = AttnSpec(batch=2, seqlens_q=(seq,), heads_q=16, head_dim=128, dtype="bf16", causal=causal, pass_=pass_)
    verdict = verdict or ("pass" if exact else "approx-pass")
    fields = dict(median_ms=1.0 / tflops, tflops=tflops, gbps=2 * tflops) if status == "ok" else {}
    info = {"exact": exact, **({"clock_dropped": True} if dropped else {})}
    return Record(run_id="r", backend=backend, spec=spec, status=status, reason=reason, info=info,
                  accuracy={"verdict": verdict} if status == "ok" else None, **fields)


def default_gpu_sweep() -> list[Record]:
    """23 backends x the default GPU sweep's 32 shapes; fa3 fastest from 1k, sdpa-cudnn below; approximate
    kernels forward only and faster still (dense-equivalent), sparge failing its check."""
    out = []
    for causal in (False, True):
        for pass_ in ("fwd", "fwd_bwd"):
            for s in LENGTHS:
                for i, b in enumerate(EXACT):
                    tf = 10.0 + i + (s / 16384) * (700 if b == "fa3" else 600 if b == "sdpa-cudnn" else 300)
                    out.append(rec(b, s, causal, pass_, tf, dropped=b == "fa3" and s == 16384))
                for b in APPROX:
                    if pass_ == "fwd_bwd":
                        out.append(rec(b, s, causal, pass_, None, exact=False, status="unsupported",
                                       reason="forward only (no backward)"))
                    else:
                        fails = b.startswith("sparge")
                        out.append(rec(b, s, causal, pass_, 2000.0 if fails else 900.0, exact=False,
                                       verdict="approx-fail" if fails else "approx-pass"))
    return out


def rendered(built: summary.Summary, width: int = 100) -> list[str]:
    console = Console(width=width, force_terminal=False, record=True)
    with console.capture() as cap:
        summary.render(built, console)
    return cap.get().splitlines()


def test_the_default_gpu_sweep_with_23_backends_fits_one_screen_of_100_columns():
    records = default_gpu_sweep()
    lines = rendered(summary.build(records, width=100, device="GPU"))
    assert max(len(line) for line in lines) <= 100
    assert len(lines) <= 56, "\n".join(lines)
    # API forms share their kernel's column, the approximate kernels share one
    header = " ".join(lines[1:4])
    assert "fa2-varlen" not in header and "fastest approx." in header
    # each row marks the fastest exact kernel: fa3 at 16k, and never an approximate one
    row16k = [line for line in lines if line.split()[-3:] and "16384" in line.split()][0]
    assert "*" in row16k and row16k.count("*") == 1
    cells = row16k.split()
    starred = cells[[i for i, c in enumerate(cells) if "*" in c][0]]
    assert starred == "721↓*"  # fa3: 10 + 11 + 700, its clock dropped
    # the failing sparse kernel is not offered as the fastest approximation when a passing one exists
    assert "sparge" not in row16k and "sage" in row16k


def test_footnotes_count_each_reason_once_and_name_the_backends():
    lines = rendered(summary.build(default_gpu_sweep()))
    notes = [line for line in lines if "unsupported" in line]
    assert len(notes) == 1 and notes[0].startswith("144 unsupported: forward only (no backward)")
    assert any("SM clock fell >10% in the case (4)" in line for line in lines)
    # the failing sparse kernels give way to passing ones in the shared column: no cell shows "!", so the
    # legend does not count it, and a line says where the 64 failures are
    assert not any("!" in line for line in lines)
    assert any(line.startswith("64 results failed their accuracy check in cells this table does not show "
                               "(sparge 16,") for line in lines)


def test_marks_are_counted_as_shown_and_a_backends_mismatches_are_one_line():
    reason = "dv max_abs {:.3g} > 0.003 (= 3 x math 0.001 + floor 1e-4)"
    records = [rec("fa2", s, False, "fwd_bwd", 5.0 + s / 100, verdict="fail", status="ok") for s in LENGTHS[:6]]
    for r, s in zip(records, LENGTHS):
        r.status, r.reason = "mismatch", reason.format(0.004 + s / 1e6)
    records += [rec("sdpa-flash", s, False, "fwd_bwd", 1.0, dropped=s == 128) for s in LENGTHS[:6]]
    lines = rendered(summary.build(records))
    assert lines[-2] == "* fastest exact kernel   ↓ SM clock fell >10% in the case (1)"
    assert lines[-1] == "6 mismatch: dv max_abs above its limit (fa2)"  # one line, not six


def rows_of(built: summary.Summary, row: str) -> dict:
    return {col: c for (r, col), c in built.pivots[0].groups[0].cells.items() if r == row}


def test_ties_at_the_precision_shown_are_all_marked_and_a_busy_rival_leaves_the_row_unmarked():
    tie = [rec("naive", 128, False, "fwd", 0.10004), rec("sdpa-math", 128, False, "fwd", 0.10001),
           rec("sdpa-flash", 128, False, "fwd", 0.05)]
    cells = rows_of(summary.build(tie), "128")
    assert cells["naive"].best and cells["sdpa-math"].best and not cells["sdpa-flash"].best
    busy = [rec("naive", 128, False, "fwd", 0.2), rec("sdpa-math", 128, False, "fwd", 0.1)]
    busy[1].info["cpu"] = {"busy": True, "threads": 1, "cores": 2}
    cells = rows_of(summary.build(busy), "128")
    # sdpa-math's real rate is higher than shown: it may be the fastest, so neither is marked
    assert not any(c.best for c in cells.values()) and cells["sdpa-math"].text.endswith("?")
    busy[0].info["cpu"], busy[1].info["cpu"] = busy[1].info["cpu"], {"threads": 1, "cores": 2}
    cells = rows_of(summary.build(busy), "128")  # the fastest is busy, its rival not: it is the fastest
    assert cells["naive"].best and cells["naive"].text == "200?*"


def test_a_kernel_alone_in_its_row_is_not_marked_fastest():
    alone = [rec("naive", 128, False, "fwd", 0.1), rec("naive", 256, False, "fwd", 0.2),
             rec("sdpa-flash", 256, False, "fwd", 0.3), rec("sdpa-flash", 512, False, "fwd", None,
                                                             status="unsupported", reason="no")]
    built = summary.build(alone)
    assert not rows_of(built, "128")["naive"].best and rows_of(built, "128")["naive"].text == "100"
    assert rows_of(built, "256")["sdpa-flash"].best  # two ran: the faster is marked
    one = summary.build([rec("naive", s, False, "fwd", 0.1) for s in (128, 256)])
    lines = rendered(one)
    assert not any("*" in line for line in lines), lines  # no mark, and no footnote explaining one


def test_each_mark_of_the_legend_is_an_item_of_its_own_on_a_page():
    from attnbench.report import html_tables
    marks = [rec("naive", 128, False, "fwd", 0.2), rec("sdpa-math", 128, False, "fwd", 0.1)]
    marks[0].info["cpu"] = {"busy": True, "threads": 1, "cores": 2}
    built = summary.build(marks)
    busy = "? CPU busy with other processes: not an idle machine's speed (1)"
    assert built.legend == ["* fastest exact kernel", busy]
    assert f"* fastest exact kernel   {busy}" in rendered(built)  # one terminal line
    page = html_tables.pivot_html(built)
    assert f"<li>* fastest exact kernel</li><li>{busy.replace(chr(39), '&#x27;')}</li>" in page
    assert page.count("<li>?") == 1  # one mark, explained once
    items = ["* fastest exact kernel", "↓ SM clock fell >10% in the case (1)", built.legend[1]]
    assert summary.legend_lines(items, 100) == [f"{items[0]}   {items[1]}", items[2]]  # whole items, <= 100


def with_ci(r: Record, half_pct: float) -> Record:
    r.info["median_ci95_ms"] = [r.median_ms * (1 - half_pct / 100), r.median_ms * (1 + half_pct / 100)]
    return r


def test_a_runner_up_within_the_fastests_interval_turns_the_star_into_a_tie():
    # fa3 1% faster than fa2, each median known to +-0.6%: the intervals overlap, the run cannot rank them
    close = [with_ci(rec("fa3", 4096, False, "fwd", 505.0), 0.6), with_ci(rec("fa2", 4096, False, "fwd", 500.0), 0.6),
             with_ci(rec("sdpa-flash", 4096, False, "fwd", 400.0), 0.6)]
    built = summary.build(close)
    cells = rows_of(built, "4096")
    assert cells["fa3"].text == "505≈" and cells["fa3"].best and cells["fa3"].tie
    assert cells["fa2"].text == "500≈" and not cells["fa2"].best and cells["fa2"].tie
    assert cells["sdpa-flash"].text == "400" and not cells["sdpa-flash"].tie  # 20% slower: apart
    lines = rendered(built)
    assert max(len(line) for line in lines) <= 100
    assert "≈ fastest, within each other's interval (1 row)" in lines[-2] and "*" not in lines[-2]
    assert lines[-1].startswith("≈ the fastest exact kernel and those whose 95% interval")
    # known to +-0.3% each, the same 1% gap is resolved: a star, no tie
    apart = [with_ci(rec("fa3", 4096, False, "fwd", 505.0), 0.3), with_ci(rec("fa2", 4096, False, "fwd", 500.0), 0.3)]
    cells = rows_of(summary.build(apart), "4096")
    assert cells["fa3"].text == "505*" and not cells["fa2"].tie and not cells["fa3"].tie
    # in ms, lower is better: the same two are tied
    cells = rows_of(summary.build(close, metric="ms"), "4096")
    assert cells["fa3"].text.endswith("≈") and cells["fa2"].text.endswith("≈")
    # a record without an interval (an older store) keeps the star
    del close[1].info["median_ci95_ms"]
    cells = rows_of(summary.build(close), "4096")
    assert cells["fa3"].text == "505*" and not cells["fa2"].tie


def test_cpu_rates_in_gflops_and_small_speedups_keep_their_digits():
    records = [rec("naive", 128, False, "fwd", 0.0151), rec("sdpa-math", 128, False, "fwd", 0.0249),
               rec("sdpa-flash", 128, False, "fwd", 0.000061)]
    built = summary.build(records)
    assert "GF/s" in built.header
    cells = rows_of(built, "128")
    assert (cells["naive"].text, cells["sdpa-math"].text) == ("15.1", "24.9*")
    speed = rows_of(summary.build(records, metric="speedup", baseline="naive"), "128")
    assert speed["sdpa-flash"].text == "4e-3" and speed["sdpa-math"].text.startswith("1.65")
    assert summary.fmt(0.042, "speedup") == "0.042"


def test_cpu_runs_say_their_threads_and_when_they_were_lowered():
    records = [rec("naive", s, False, "fwd", 0.02) for s in LENGTHS[:3]]
    for r, threads in zip(records, (2, 1, 1)):
        r.info["cpu"] = {"threads": threads, "cores": 2, "others_at_start": 0.04}
    lines = rendered(summary.build(records))
    assert "CPU: 2 threads of 2 cores; 1 from case 2 on, when other processes took cores" in lines


def test_wide_terminals_get_a_column_per_backend():
    lines = rendered(summary.build(default_gpu_sweep(), width=200), width=200)
    header = " ".join(lines[1:4])
    assert "fastest approx." not in header and "sparge" in header and "varlen" in header


def test_speedup_against_a_baseline_and_times_in_ms():
    records = default_gpu_sweep()
    speed = summary.build(records, metric="speedup", baseline="naive")
    cells = speed.pivots[0].groups[0].cells
    assert cells[("128", "naive")].text == "1.00"
    assert cells[("128", "sdpa-math")].value == pytest.approx((10.0 + 128 / 16384 * 300 + 1) / (10.0 + 128 / 16384 * 300))
    ms = summary.build(records, metric="ms")
    best = [c for (row, _), c in ms.pivots[0].groups[0].cells.items() if row == "16384" and c.best]
    assert len(best) == 1 and best[0].value == pytest.approx(1 / 721.0)  # the smallest time is the best one
    with pytest.raises(ValueError, match="unknown metric"):
        summary.build(records, metric="flops")


def test_fixed_axes_go_to_the_header_and_the_rows_are_the_swept_axis():
    records = [rec("naive", 64, False, "fwd", 1.0), rec("naive", 128, False, "fwd", 2.0)]
    built = summary.build(records)
    assert built.header.startswith("b2 h16 d128 bf16 no mask fwd · TF/s")
    assert built.pivots[0].row_axis == "seq" and built.pivots[0].groups[0].rows == ["64", "128"]


def test_rows_of_grouped_sequences_grow_with_their_tokens():
    """benchmark_attn.py's grouped series: 1…256 sequences of 128 tokens, labelled "2q128" … "256q128" alike (eight
    spelled out took 31 columns and pushed the table past 100); the rows follow the tokens (16q128 came before
    128,128 by the sum of its numbers). Sequences of different lengths stay a list."""
    counts = (1, 2, 4, 8, 16, 32, 256)
    records = [Record(run_id="r", backend="fa2-varlen", status="ok", median_ms=0.01 * n, tflops=1.0,
                      spec=AttnSpec(seqlens_q=(128,) * n, heads_q=32, head_dim=128, dtype="fp16"))
               for n in reversed(counts)]
    rows = summary.build(records).pivots[0].groups[0].rows
    assert rows == ["128", "2q128", "4q128", "8q128", "16q128", "32q128", "256q128"]
    mixed = [Record(run_id="r", backend="fa2-varlen", status="ok", median_ms=0.01, tflops=1.0,
                    spec=AttnSpec(seqlens_q=lens, heads_q=32, head_dim=128, dtype="fp16"))
             for lens in ((77, 300, 1, 1000), (512, 512, 1024))]
    assert summary.build(mixed).pivots[0].groups[0].rows == ["77,300,1,1000", "512,512,1024"]


def test_verify_grid_names_cases_and_marks_failures():
    spec = AttnSpec(batch=1, seqlens_q=(100,), heads_q=4, head_dim=64, dtype="fp32", causal=True, pass_="fwd_bwd")
    limits = {"out": {"max_abs": 1e-3}, "dq": {"max_abs": 2e-3}}
    good = Record(run_id="v", backend="a", spec=spec, accuracy={"verdict": "pass", "limits": limits,
                  "tensors": {"out": {"max_abs": 5e-4}, "dq": {"max_abs": 1e-3}}})
    bad = Record(run_id="v", backend="b", spec=spec, status="mismatch", accuracy={"verdict": "fail", "limits": limits,
                 "tensors": {"out": {"max_abs": 3e-3}, "dq": {"max_abs": 1e-3}}})
    skip = Record(run_id="v", backend="c", spec=spec, status="unsupported", reason="varlen not supported")
    backends, cases, cells, legend = grid.build([good, bad, skip])
    assert backends == ["a", "b", "c"] and len(cases) == 1
    assert cells[("a", cases[0])] == ".50" and cells[("b", cases[0])] == "3.0✗" and cells[("c", cases[0])] == "-"
    console = Console(width=100, force_terminal=False)
    with console.capture() as cap:
        grid.render([good, bad, skip], console)
    assert "not checked, 1 unsupported: varlen not supported (c)" in cap.get()


def test_figures_keep_panels_readable_and_a_colour_per_backend():
    rows = [dict(r.to_row(), info=json.dumps(r.info)) for r in default_gpu_sweep()]
    sets = plots.backend_sets(rows)
    names = [n for n, _ in sets]
    assert names == ["exact kernels", "approximate kernels (dense-equivalent rates)", "API forms of one kernel"]
    for _, subset in sets:
        assert len({r["backend"] for r in subset}) <= plots.MAX_LINES
        labels = sorted({r["backend"] for r in subset})
        style = styles.styles(labels)
        # within a figure every backend has a colour of its own (sdpa-flash and sdpa-math were both blue)
        assert len({style[b]["color"] for b in labels}) == len(labels), labels
    approx = {r["backend"] for r in sets[1][1]}
    assert all(b.endswith(" ≈") for b in approx)
    style = styles.styles(["fa2", "fa2-varlen", "sdpa-flash", "sdpa-cudnn", "sage2-fp8 ≈", "fa2 run b"])
    assert style["fa2"]["marker"] == style["fa2-varlen"]["marker"] != style["sdpa-flash"]["marker"]  # a family
    assert style["fa2"]["color"] != style["fa2-varlen"]["color"]
    assert style["fa2"]["color"] == styles.colour("fa2")  # the same in every figure
    # the line style says one thing: the variant of a line (here another run), never the family member
    assert {style[b]["linestyle"] for b in ("fa2", "fa2-varlen", "sdpa-flash", "sdpa-cudnn", "sage2-fp8 ≈")} == {"-"}
    assert style["fa2 run b"]["linestyle"] == "--" and style["fa2 run b"]["color"] == style["fa2"]["color"]
    assert style["sage2-fp8 ≈"]["markerfacecolor"] == "white"  # approximate: hollow markers
    # every built-in backend has a colour set for it, and a (colour, marker) of its own
    assert set(EXACT + APPROX) | {"fa4", "xformers", "flashinfer", "flex-sparse", "sta"} <= set(styles.COLOURS)
    assert len({(styles.colour(b), styles.marker(b)) for b in styles.COLOURS}) == len(styles.COLOURS)
    # a grouped-sequence sweep draws the variable-length kernels together (fa2-varlen and sdpa-varlen were both purple)
    varlen = ["fa2-varlen", "fa2-varlen-qkvpacked", "fa3-varlen", "fa4-varlen", "sdpa-varlen", "sage-varlen", "flex",
              "naive", "sdpa-math", "xformers", "flashinfer"]
    assert len({styles.colour(b) for b in varlen}) == len(varlen)
    # key lengths equal to query lengths: one figure, not two
    assert plots.plot_axes(rows) == ["seq_len"]
    same = [r for r in rows if r["seq_len"] == 4096]
    assert plots.plot_axes(same) == [] and "sequence length (tokens) 4k" in plots.why_no_plot(same)


def test_a_column_widens_for_a_long_title_instead_of_cutting_it():
    from attnbench.report.summary import column_width, header_lines
    assert header_lines("flashinfer") == "flashinfer" and column_width("flashinfer") == 10
    assert header_lines("flashinfer-decode") == "flashinfer\ndecode"
    assert header_lines("sdpa-cudnn") == "sdpa\ncudnn" and column_width("fa3") == 6
    assert header_lines("fa2-varlen-qkvpacked") == "fa2\nvarlen-qk…"


def test_a_row_whose_other_kernel_is_unsupported_marks_none_fastest():
    records = [rec("naive", 128, False, "fwd", 0.02), rec("sdpa-math", 128, False, "fwd", 0.03),
               rec("naive", 256, False, "fwd", 0.02), rec("sdpa-math", 256, False, "fwd", None, status="unsupported")]
    built = summary.build(records)
    assert rows_of(built, "128")["sdpa-math"].best  # two ran: the faster is marked
    alone = rows_of(built, "256")
    assert not any(c.best for c in alone.values()) and "*" not in alone["naive"].text
    assert not any(c.best for c in rows_of(summary.build(records[:1]), "128").values())  # one kernel in the run

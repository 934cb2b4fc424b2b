"""The write-ups' own formats from stored runs (benchmarks/seeds/tables.py). benchmark_attn.py's series side by
side (tables.py benchmark-attn): each run of benchmark_attn.sh lands in its series and sequence kind, every kernel
gets a table with each series' median per length, and a summary puts each profiler's times over the events times.
The formats' first names and the runs stored under them still work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attnbench.results.record import Record
from attnbench.spec import AttnSpec

spec_ = importlib.util.spec_from_file_location("workload_tables", Path(__file__).parents[2] / "benchmarks/seeds/tables.py")
tables = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(tables)


def test_run_ids_map_to_series_and_kind():
    assert tables._series("benchmark-attn-single") == ("events", "single")
    assert tables._series("benchmark-attn-grouped") == ("events", "grouped")
    assert tables._series("benchmark-attn-ncu") == ("ncu", "single")
    assert tables._series("benchmark-attn-nsys-grouped") == ("nsys", "grouped")
    # runs stored before the script was renamed (docs/results/raw/h100-2026-11-26/) read the same
    assert tables._series("seed000-single") == ("events", "single")
    assert tables._series("seed000-ncu-grouped") == ("ncu", "grouped")


def _record(run_id: str, backend: str, seqlens: tuple[int, ...], ms: float | None, status: str = "ok") -> Record:
    spec = AttnSpec(seqlens_q=seqlens, heads_q=2, head_dim=16, dtype="fp32")
    return Record(run_id=run_id, backend=backend, status=status, spec=spec, median_ms=ms)


def test_every_kernel_gets_its_series_side_by_side():
    records = [_record("benchmark-attn-single", "fa2", (128,), 0.05), _record("benchmark-attn-ncu", "fa2", (128,), 0.04),
               _record("benchmark-attn-single", "fa2", (256,), 0.09), _record("benchmark-attn-ncu", "fa2", (256,), None, "error"),
               _record("benchmark-attn-grouped", "fa2", (128, 128), 0.07),
               _record("benchmark-attn-nsys-grouped", "fa2", (128, 128), 0.06),
               _record("benchmark-attn-single", "flex", (128,), 0.2)]
    text = tables.benchmark_attn_tables(records)
    assert "### fa2, single sequence (ms)" in text and "### fa2, grouped sequences (ms)" in text
    assert "| seq_len | events | ncu | nsys |" in text
    assert "| 128 | 0.05 | 0.04 | — |" in text and "| 256 | 0.09 | error | — |" in text
    assert "| 2 | 0.07 | — | 0.06 |" in text  # two sequences of 128: the grouped row
    assert "### flex, single sequence (ms)" in text and "| 128 | 0.2 | — | — |" in text


def test_the_summary_gives_each_profilers_ratio_to_events_and_unsupported_rows_are_counted_not_shown():
    records = [_record("benchmark-attn-single", "fa2", (128,), 0.10), _record("benchmark-attn-ncu", "fa2", (128,), 0.08),
               _record("benchmark-attn-single", "fa2", (256,), 0.20), _record("benchmark-attn-ncu", "fa2", (256,), 0.19),
               _record("benchmark-attn-single", "fa2", (512,), 0.40), _record("benchmark-attn-ncu", "fa2", (512,), 0.36),
               _record("benchmark-attn-grouped", "fa2", (128,), 0.1), _record("benchmark-attn-ncu-grouped", "fa2", (128,), 0.09),
               _record("benchmark-attn-grouped", "fa2", (128, 128), None, "unsupported"),
               _record("benchmark-attn-ncu-grouped", "fa2", (128, 128), None, "unsupported"),
               _record("benchmark-attn-grouped", "fa2", (128,) * 4, None, "unsupported")]
    text = tables.benchmark_attn_tables(records)
    summary = text.split("\n\n### ")[0]
    assert "| kernel | sequences | ncu |" in summary
    assert "| fa2 | single | 0.90 (0.80–0.95) |" in summary  # ratios 0.8, 0.95, 0.9: their median and range
    assert "| fa2 | grouped | 0.90 |" in summary
    assert summary.index("| fa2 | single |") < summary.index("| fa2 | grouped |")
    grouped = text.split("### fa2, grouped sequences (ms)")[1]
    assert "| 1 | 0.1 | 0.09 |" in grouped and "| 2 |" not in grouped and "| 4 |" not in grouped
    assert "Unsupported by every series: 2, 4 sequences." in grouped
    assert text.index("### fa2, single sequence") < text.index("### fa2, grouped sequences")


def test_the_formats_go_by_the_workloads_names_and_the_old_names_still_work(tmp_path, capsys):
    from attnbench.results.store import ResultStore
    db = tmp_path / "benchmark_attn.db"
    records = [_record("benchmark-attn-single", "fa2", (128,), 0.05), _record("benchmark-attn-ncu", "fa2", (128,), 0.04)]
    with ResultStore(db) as store:
        for run_id in ("benchmark-attn-single", "benchmark-attn-ncu"):
            store.start_run(run_id, command="test", config={}, env_id=None, version="test")
        for record in records:
            store.write(record)
    runs = ["--db", str(db), "--run", "benchmark-attn-single", "benchmark-attn-ncu"]
    assert tables.main(["benchmark-attn", *runs, "-o", str(tmp_path / "new.md")]) == 0
    assert tables.main(["seed000", *runs, "-o", str(tmp_path / "old.md")]) == 0  # the old name, accepted silently
    assert (tmp_path / "old.md").read_text() == (tmp_path / "new.md").read_text()
    assert "| 128 | 0.05 | 0.04 |" in (tmp_path / "new.md").read_text()
    with pytest.raises(SystemExit):
        tables.main(["cogvideox", *runs])  # no table format of its own
    with pytest.raises(SystemExit):
        tables.main(["--help"])
    shown = capsys.readouterr()
    assert "benchmark-attn" in shown.err and "fa2-writeup" in shown.err and "naive-vs-fa2" in shown.err
    assert "{benchmark-attn,fa2-writeup,naive-vs-fa2}" in shown.out
    assert "seed00" not in shown.out + shown.err  # help and errors show only the workloads' names


def test_the_fa2_writeups_table_has_a_header_cell_for_every_cell_of_its_rows():
    """The rate was a row's last cell with no column over it after `attnbench dist` split its rate column off."""
    ok = _record("fa2-writeup-batch", "fa2", (128,), 0.5)
    ok.tflops = 1.5
    records = [ok, _record("fa2-writeup-batch", "fa2", (256,), None, "oom")]
    lines = [line for line in tables.fa2_writeup_tables(records).splitlines() if line.startswith("|")]
    assert lines[0].endswith("| TFLOP/s |")
    assert len({line.count("|") for line in lines}) == 1, lines

"""benchmark_attn.py's series side by side (benchmarks/seeds/tables.py seed000): each run of seed000.sh lands in its
series and sequence kind, every kernel gets a table with each series' median per length, and a summary puts each
profiler's times over the events times."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnbench.results.record import Record
from attnbench.spec import AttnSpec

spec_ = importlib.util.spec_from_file_location("seed_tables", Path(__file__).parents[2] / "benchmarks/seeds/tables.py")
tables = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(tables)


def test_run_ids_map_to_series_and_kind():
    assert tables._series("seed000-single") == ("events", "single")
    assert tables._series("seed000-grouped") == ("events", "grouped")
    assert tables._series("seed000-ncu") == ("ncu", "single")
    assert tables._series("seed000-nsys-grouped") == ("nsys", "grouped")


def _record(run_id: str, backend: str, seqlens: tuple[int, ...], ms: float | None, status: str = "ok") -> Record:
    spec = AttnSpec(seqlens_q=seqlens, heads_q=2, head_dim=16, dtype="fp32")
    return Record(run_id=run_id, backend=backend, status=status, spec=spec, median_ms=ms)


def test_every_kernel_gets_its_series_side_by_side():
    records = [_record("seed000-single", "fa2", (128,), 0.05), _record("seed000-ncu", "fa2", (128,), 0.04),
               _record("seed000-single", "fa2", (256,), 0.09), _record("seed000-ncu", "fa2", (256,), None, "error"),
               _record("seed000-grouped", "fa2", (128, 128), 0.07),
               _record("seed000-nsys-grouped", "fa2", (128, 128), 0.06),
               _record("seed000-single", "flex", (128,), 0.2)]
    text = tables.seed000_tables(records)
    assert "### fa2, single sequence (ms)" in text and "### fa2, grouped sequences (ms)" in text
    assert "| seq_len | events | ncu | nsys |" in text
    assert "| 128 | 0.05 | 0.04 | — |" in text and "| 256 | 0.09 | error | — |" in text
    assert "| 2 | 0.07 | — | 0.06 |" in text  # two sequences of 128: the grouped row
    assert "### flex, single sequence (ms)" in text and "| 128 | 0.2 | — | — |" in text


def test_the_summary_gives_each_profilers_ratio_to_events_and_unsupported_rows_are_counted_not_shown():
    records = [_record("seed000-single", "fa2", (128,), 0.10), _record("seed000-ncu", "fa2", (128,), 0.08),
               _record("seed000-single", "fa2", (256,), 0.20), _record("seed000-ncu", "fa2", (256,), 0.19),
               _record("seed000-single", "fa2", (512,), 0.40), _record("seed000-ncu", "fa2", (512,), 0.36),
               _record("seed000-grouped", "fa2", (128,), 0.1), _record("seed000-ncu-grouped", "fa2", (128,), 0.09),
               _record("seed000-grouped", "fa2", (128, 128), None, "unsupported"),
               _record("seed000-ncu-grouped", "fa2", (128, 128), None, "unsupported"),
               _record("seed000-grouped", "fa2", (128,) * 4, None, "unsupported")]
    text = tables.seed000_tables(records)
    summary = text.split("\n\n### ")[0]
    assert "| kernel | sequences | ncu |" in summary
    assert "| fa2 | single | 0.90 (0.80–0.95) |" in summary  # ratios 0.8, 0.95, 0.9: their median and range
    assert "| fa2 | grouped | 0.90 |" in summary
    assert summary.index("| fa2 | single |") < summary.index("| fa2 | grouped |")
    grouped = text.split("### fa2, grouped sequences (ms)")[1]
    assert "| 1 | 0.1 | 0.09 |" in grouped and "| 2 |" not in grouped and "| 4 |" not in grouped
    assert "Unsupported by every series: 2, 4 sequences." in grouped
    assert text.index("### fa2, single sequence") < text.index("### fa2, grouped sequences")

"""benchmark_attn.py's series side by side (benchmarks/seeds/tables.py seed000): each run of seed000.sh lands in its
series and sequence kind, and every kernel gets a table with each series' median per length."""

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

"""benchmarks/mla.py's page: FlashInfer's two templates are two columns of the comparison, and the prefill run gets
its own table with forward and forward+backward rows, each cell's time, TF/s and verdict."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from attnbench.results.record import Record
from attnbench.results.store import ResultStore

_spec = importlib.util.spec_from_file_location("mla_bench", Path(__file__).parents[2] / "benchmarks/mla.py")
mla = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mla)


def _write(store, run_id: str, records: list[Record]) -> None:
    store.start_run(run_id, command="test", config={}, env_id="e", version="0")
    for r in records:
        store.write(r)


def _ok(run_id, backend, spec, ms, template=None, verdict="pass", gbps=100.0, tflops=10.0) -> Record:
    return Record(run_id=run_id, backend=backend, spec=spec, median_ms=ms, gbps=gbps, tflops=tflops, env_id="e",
                  accuracy={"verdict": verdict}, info={"template": template} if template else {})


def test_the_page_sets_flashinfers_templates_and_the_prefill_run_side_by_side(tmp_path, capsys):
    db = tmp_path / "mla.db"
    store = ResultStore(db)
    store.add_env("e", {"device_name": "GPU"})
    store.add_peak("GPU", "e", "read", 1000.0, "GB/s")
    decode = mla.spec(16, 4, 1024)
    _write(store, "mla-compare", [_ok("mla-compare", "flashmla", decode, 0.05, gbps=900.0),
                                  _ok("mla-compare", "flashinfer-mla", decode, 0.06, "fa3", gbps=800.0)])
    _write(store, "mla-compare-fa2", [_ok("mla-compare-fa2", "flashinfer-mla", decode, 0.09, "fa2", gbps=500.0,
                                          verdict="fail")])
    fwd, fwd_bwd = mla.prefill_specs()[0], mla.prefill_specs()[len(mla.PREFILL_LENGTHS)]
    longer = mla.prefill_specs()[1]
    _write(store, "mla-prefill", [
        _ok("mla-prefill", "fa3", fwd_bwd, 6.25, tflops=410.0), _ok("mla-prefill", "fa3", longer, 4.5, tflops=600.0),
        _ok("mla-prefill", "fa3", fwd, 1.5, tflops=500.0),
        _ok("mla-prefill", "flex", fwd, 0.5, tflops=300.0),
        Record(run_id="mla-prefill", backend="flex", spec=fwd_bwd, status="error", reason="out of memory")])
    store.close()
    args = argparse.Namespace(db=str(db), run_id="mla", script_log=None, compare_run="mla-compare,mla-compare-fa2",
                              prefill_run="mla-prefill", output=str(tmp_path / "page.md"))
    mla.cmd_page(args)
    text = (tmp_path / "page.md").read_text()
    assert "| heads | requests | mean cache | `flashmla` | `flashinfer-mla (fa2)` | `flashinfer-mla (fa3)` |" in text
    assert "| 16 | 4 | 1027 | 50 µs · 900 GB/s · 90% · 10 TF/s | 90 µs · 500 GB/s · 50% · 10 TF/s (fail) | " \
           "60 µs · 800 GB/s · 80% · 10 TF/s |" in text
    assert "| pass | sequences | `fa3` | `flex` |" in text
    rows = [line for line in text.splitlines() if line.startswith("| fwd")]
    assert rows == ["| fwd | 16 × 1024 | 1.50 ms · 500 TF/s | 500 µs · 300 TF/s |",  # forward first, by length
                    "| fwd | 4 × 4096 | 4.50 ms · 600 TF/s | — |",
                    "| fwd_bwd | 16 × 1024 | 6.25 ms · 410 TF/s | error |"], rows
    assert "- `flex` error: out of memory" in text


def test_run_prints_a_case_a_line_within_100_columns():
    ok = _ok("mla-compare", "flashinfer-mla", mla.spec(128, 256, 65536), 4.2763, "fa2", gbps=3058.0, tflops=626.0)
    refused = Record(run_id="mla-prefill", backend="fa4", spec=mla.prefill_specs()[-1], status="unsupported",
                     reason="flash_attn.cute not importable: ModuleNotFoundError: No module named 'flash_attn'")
    lines = [mla.line(ok), mla.line(refused)]
    assert lines[0].split() == ["flashinfer-mla", "(fa2)", "128", "heads,", "256", "×", "65791", "ok", "4276.3", "µs",
                                "3058", "GB/s", "626", "TF/s"]
    assert lines[1].startswith("fa4") and "1 × 16384 fwd_bwd" in lines[1] and "flash_attn.cute" in lines[1]
    assert max(len(x) for x in lines) <= 100, lines

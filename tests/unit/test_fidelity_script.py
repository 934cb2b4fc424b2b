"""benchmarks/fidelity.py's comparison logic (the GPU parts run on the GPU machine)."""

import importlib.util
from pathlib import Path

from attnbench.results.record import Record

spec = importlib.util.spec_from_file_location("fidelity", Path(__file__).parents[2] / "benchmarks" / "fidelity.py")
fidelity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fidelity)


def test_verdict_applies_the_targets():
    assert fidelity.verdict(0.2, 2.5, 9.0) == "ok"
    assert fidelity.verdict(0.2, -3.5, 0.0) == "MISS events"
    assert fidelity.verdict(0.02, 9.0, 4.0) == "ok"
    assert fidelity.verdict(0.02, 0.0, 6.0) == "MISS graph"
    assert fidelity.verdict(0.005, 50.0, 50.0) == "below 10 us" and fidelity.verdict(None, 0, 0) == "no ncu"


def test_rows_and_files(tmp_path):
    cases = fidelity.specs(fidelity.SHAPES[:1])
    label = cases[0].label()
    records = {(b, label, m): Record(run_id="r", backend=b, spec=cases[0], median_ms=0.1 * (1 + i / 100),
                                     info={"kernels": ["k"], "graph_cold": True})
               for b in fidelity.BACKENDS for i, m in enumerate(fidelity.MODES)}
    records[("sdpa-cudnn", label, "graph")] = Record(run_id="r", backend="sdpa-cudnn", spec=cases[0],
                                                     status="unsupported", reason="no cuDNN")
    ncu = {(b, label): (0.1, ["kernel"]) for b in fidelity.BACKENDS}
    rows = fidelity.build_rows(cases, records, ncu)
    flash = next(r for r in rows if r["backend"] == "sdpa-flash")
    assert flash["events_vs_ncu_pct"] == 0.0 and round(flash["graph_vs_ncu_pct"], 6) == 1.0
    assert flash["verdict"] == "ok"
    assert next(r for r in rows if r["backend"] == "sdpa-cudnn")["status"].startswith("unsupported")
    fidelity.write(rows, tmp_path, "# header")
    assert (tmp_path / "fidelity.csv").read_text().startswith("backend,case,ncu_ms")
    assert "| sdpa-flash |" in (tmp_path / "fidelity.md").read_text()

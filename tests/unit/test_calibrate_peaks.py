"""calibrate on CPU stores peaks; the store migrates v1 files; tables show % of the measured peak."""

import json
import sqlite3

import pytest

from attnbench.cli import main
from attnbench.report.table import percent_of_peak, records_table
from attnbench.results.env import device_name
from attnbench.results.record import SCHEMA_VERSION, Record
from attnbench.results.store import ResultStore, StoreError
from attnbench.spec import AttnSpec
from attnbench.timing import peaks


def test_calibrate_on_cpu_writes_peaks(tmp_path, capsys):
    db = tmp_path / "r.db"
    with pytest.raises(SystemExit) as done:
        main(["calibrate", "--device", "cpu", "--db", str(db), "--size", "64", "--copy-mib", "4", "--repeat", "2",
              "--json"])
    assert done.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["kind"] for p in out["peaks"]} == {"matmul_bf16", "matmul_fp16", "copy", "read"}
    with ResultStore(db) as store:
        stored = store.peaks(device_name("cpu"))
    assert set(stored) == {"matmul_bf16", "matmul_fp16", "copy", "read"}
    assert all(v["value"] > 0 for v in stored.values()) and stored["copy"]["unit"] == "GB/s"
    assert stored["copy"]["details"]["matmul_n"] == 64
    assert peaks.measured_peaks(db, "cpu") == {"bf16": stored["matmul_bf16"]["value"],
                                               "fp16": stored["matmul_fp16"]["value"]}
    assert peaks.measured_peaks(tmp_path / "none.db", "cpu") == {}


def test_bad_calibrate_size_is_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["calibrate", "--device", "cpu", "--db", str(tmp_path / "r.db"), "--size", "0"])
    assert done.value.code == 2 and "--size" in capsys.readouterr().err


def test_store_migrates_version_1_file(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # what attnbench with schema 1 left behind
        conn.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
                           "INSERT INTO meta VALUES ('schema_version', '1');")
    with ResultStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 5
        store.add_peak("GPU X", "env1", "copy", 1000.0, "GB/s")
        store.add_peak("GPU X", "env1", "copy", 1200.0, "GB/s")  # replaces
        assert store.peaks("GPU X")["copy"]["value"] == 1200.0 and store.peaks("other") == {}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match="upgrade"):
        ResultStore(path)


def test_datasheet_lookup():
    assert peaks.datasheet("NVIDIA H100 80GB HBM3") == {"matmul_bf16": 989.0, "matmul_fp16": 989.0, "copy": 3350.0,
                                                        "read": 3350.0}
    assert peaks.datasheet("NVIDIA H200")["copy"] == 4800.0
    assert peaks.datasheet("NVIDIA H100 PCIe")["matmul_bf16"] == 756.0
    assert peaks.datasheet("AMD Instinct MI300X")["matmul_bf16"] == 1307.0
    assert peaks.datasheet("AMD EPYC 7B13") == {}


def test_table_percent_of_peak_column():
    rec = Record(run_id="r", backend="b", spec=AttnSpec(dtype="bf16"), median_ms=1.0, tflops=500.0)
    fp32 = Record(run_id="r", backend="b", spec=AttnSpec(dtype="fp32"), median_ms=1.0, tflops=5.0)
    assert percent_of_peak(rec, {"bf16": 800.0}) == pytest.approx(62.5)
    assert percent_of_peak(fp32, {"bf16": 800.0}) is None
    with_peak = records_table([rec, fp32], peaks={"bf16": 800.0})
    assert [c.header for c in with_peak.columns][6] == "% peak"
    assert list(with_peak.columns[6].cells) == ["62", "-"]
    assert "% peak" not in [c.header for c in records_table([rec]).columns]

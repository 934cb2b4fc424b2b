"""The GPU clock a number was measured at is in the terminal table, the exports and the HTML report."""

from results_fixtures import synthetic_record
from rich.console import Console

from attnbench.report import html_tables
from attnbench.report.table import records_table
from attnbench.results import export
from attnbench.results.record import clock_of
from attnbench.spec import AttnSpec

SPEC = AttnSpec(seqlens_q=(4096,), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")


def records():
    steady = {"gpu_state": {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1980}}}
    throttled = {"gpu_state": {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1650}}, "clock_dropped": True}
    return [synthetic_record("r", SPEC, "fast", [0.40, 0.41, 0.40], info=steady),
            synthetic_record("r", SPEC, "throttled", [0.45, 0.46, 0.45], info=throttled)]


def render(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_clock_of_reads_the_end_clock_and_the_drop():
    steady, throttled = records()
    assert clock_of(steady.info) == (1980, False) and clock_of(throttled.info) == (1650, True)
    assert clock_of({}) == (None, False) and clock_of('{"clock_dropped": true}') == (None, True)


def test_table_export_and_report_show_the_clock():
    recs = records()
    text = render(records_table(recs))
    assert "SM MHz" in text and "1980" in text and "1650↓" in text
    rows = export.export_rows([r.to_row() for r in recs])
    assert [(r["sm_clock_mhz"], r["clock_dropped"]) for r in rows] == [(1980, False), (1650, True)]
    page = html_tables.records_html(recs)
    assert "SM MHz" in page
    assert "1650↓" in page and 'class="dropped"' in page


def test_cpu_records_have_no_clock_column():
    spec = AttnSpec(seqlens_q=(128,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")
    rec = synthetic_record("r", spec, "naive", [1.0, 1.1, 1.0])
    assert "SM MHz" not in render(records_table([rec]))
    assert "SM MHz" not in html_tables.records_html([rec])


def test_csv_export_round_trips_the_clock(tmp_path):
    recs = records()
    path = tmp_path / "x.csv"
    export.write(recs, path)
    back = export.read(path)
    assert [(r["sm_clock_mhz"], r["clock_dropped"]) for r in back] == [(1980, False), (1650, True)]


def test_percent_of_the_measured_copy_bandwidth_appears_once_calibrated():
    recs = records()  # synthetic: 10 / median ms -> 25 GB/s for "fast"
    plain = render(records_table(recs, peaks={"bf16": 800.0}))
    assert "% peak" in plain and "% BW" not in plain
    text = render(records_table(recs, peaks={"copy": 50.0}))
    assert "% BW" in text and "% peak" not in text
    row = next(line for line in text.splitlines() if line.split()[:1] == ["fast"])
    assert " 50 " in row  # 25 of 50 GB/s


def test_a_gpu_table_with_long_names_keeps_every_number_whole_at_100_columns():
    # A decode sweep of a recurrence's kernels on a GPU: long backend names, peak memory and the clock columns. At
    # 100 columns the table once cut numbers short (553.4 shown as "553.") and hid the status; now the columns with
    # one value in every row (the pass, the clock) and the words every case shares go to the title instead.
    from attnbench.linear.spec import RecurrenceSpec
    clock = {"gpu_state": {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1980}}}
    recs = []
    for b in (1, 8, 64, 256):
        spec = RecurrenceSpec(kind="gdn", decode=True, batch=b, heads_qk=16, heads_v=64, dtype="bf16")
        for name, ms in (("flashinfer-gdn-decode", 0.01523 * b), ("fla-recurrent", 0.008960 * b),
                         ("torch-recurrent", 0.08763 * b)):
            recs.append(synthetic_record("r", spec, name, [ms] * 3, gbps=553.4 * b, tflops=0.482, info=clock,
                                         peak_mem_bytes=b * 2**22, accuracy={"verdict": "pass"}))
    console = Console(width=100, record=True)
    console.print(records_table(recs, width=100))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 100, text
    header = next(line for line in text.splitlines() if line.split()[:1] == ["backend"])
    assert header.split()[-2:] == ["check", "status"], header
    rows = [line.split() for line in text.splitlines() if line.split()[:1] == ["flashinfer-gdn-decode"]]
    assert len(rows) == 4 and all(row[-2:] == ["pass", "ok"] for row in rows), text
    assert "553.4" in rows[0] and "141670.4" in rows[-1]  # the GB/s whole, the smallest and the largest
    assert "pass fwd" in text.splitlines()[0] or "pass" in header.split(), text  # the pass said somewhere

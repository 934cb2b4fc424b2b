"""benchmarks/precision_spread.py's attribution of a case's run-to-run spread (the runs themselves are GPU work)."""

import importlib.util
from pathlib import Path

from attnbench.results.record import Record
from attnbench.spec import AttnSpec

spec = importlib.util.spec_from_file_location(
    "precision_spread", Path(__file__).parents[2] / "benchmarks" / "precision_spread.py")
spread = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spread)

CASE = AttnSpec(seqlens_q=(577,), heads_q=8, head_dim=64, dtype="bf16", pass_="fwd")


def run(clock=None, host_bound=False, dropped=False) -> Record:
    info = {"launch": {"host_ms": 0.05, "host_bound": host_bound}}
    if clock is not None:
        info["gpu_state"] = {"window": {"sm_clock_mhz": {"min": clock, "median": clock, "max": clock}}}
    if dropped:
        info["clock_dropped"] = True
    return Record(run_id="r", backend="fa2", spec=CASE, median_ms=0.1, info=info)


def test_each_case_is_put_down_to_what_its_records_show():
    assert spread.cause([run(1980), run(1980, host_bound=True), run(1975)]) == "host-bound"
    assert spread.cause([run(1980), run(1700), run(1980)]) == "clock moved"      # 14% between runs
    assert spread.cause([run(1980), run(1980, dropped=True)]) == "clock moved"   # within a run
    assert spread.cause([run(1980), run(1965), run(1970)]) == "steady clock"     # under 2%
    assert spread.cause([run(1980), run()]) == "no window"                        # older records, no NVML
    assert spread.window_clock(run(1755)) == 1755 and spread.window_clock(run()) is None

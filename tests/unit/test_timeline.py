"""Per-step timelines: phases between marks, and the per-step and per-rank summaries."""

from __future__ import annotations

import time

import pytest
import torch

from attnbench.distributed import timeline


def test_marks_do_nothing_without_a_recorder():
    timeline.begin_step("fwd", 0)
    timeline.mark("kernel")  # no error, nothing kept
    assert timeline._active is None


def test_a_phase_lasts_from_the_previous_mark_to_its_own():
    with timeline.recording(torch.device("cpu")) as rec:
        timeline.begin_step("fwd", 0)
        time.sleep(0.03)
        timeline.mark("kernel")
        timeline.begin_step("fwd", 1)
        time.sleep(0.01)
        timeline.mark("wait")
    phases = rec.phases()
    assert [(p, s, ph) for p, s, ph, _ in phases] == [("fwd", 0, "gap"), ("fwd", 0, "kernel"), ("fwd", 1, "gap"),
                                                       ("fwd", 1, "wait")]
    ms = {(s, ph): v for _, s, ph, v in phases}
    assert 25 < ms[(0, "kernel")] < 300 and 8 < ms[(1, "wait")] < 300 and ms[(1, "gap")] < 5


def test_recordings_do_not_nest():
    with timeline.recording(torch.device("cpu")), pytest.raises(RuntimeError, match="already"):
        with timeline.recording(torch.device("cpu")):
            pass
    assert timeline._active is None


def test_record_sums_repeated_phases_and_takes_the_median_over_calls():
    lengths = iter([0.002, 0.2, 0.04])  # far apart: a busy machine's late wake-ups cannot reorder the calls

    def call():
        timeline.begin_step("bwd", 0)
        for _ in range(2):  # two marks of one phase in a step add up
            time.sleep(next(lengths, 0.002) / 2)
            timeline.mark("a2a")
    rows, call_ms = timeline.record(call, torch.device("cpu"), 3)
    a2a = [ms for p, s, ph, ms in rows if ph == "a2a"]
    assert [r[:3] for r in rows] == [["bwd", 0, "gap"], ["bwd", 0, "a2a"]] and len(a2a) == 1
    assert 20 < a2a[0] < 100  # the median call: 20 + 1 ms (the others: 1 + 100 and 1 + 1)
    assert a2a[0] <= call_ms < 100  # the calls' own time holds their phases


def test_the_calls_own_time_shows_what_the_phases_leave_out():
    def call():
        timeline.begin_step("fwd", 0)
        timeline.mark("kernel")
        time.sleep(0.05)  # after the last mark: in no phase
    rows, call_ms = timeline.record(call, torch.device("cpu"), 1)
    assert sum(ms for *_, ms in rows) < 10 and call_ms >= 50


def test_summary_per_step_and_per_rank_with_compute_imbalance():
    rank0 = [["fwd", 0, "gap", 0.1], ["fwd", 0, "kernel", 10.0], ["fwd", 0, "merge", 1.0], ["fwd", 0, "wait", 5.0],
             ["fwd", 1, "kernel", 4.0]]
    rank1 = [["fwd", 0, "gap", 0.3], ["fwd", 0, "kernel", 15.0], ["fwd", 0, "merge", 1.0],
             ["fwd", 1, "kernel", 4.0], ["bwd", 0, "kernel", 2.0]]
    steps, totals = timeline.summarize([rank0, rank1], [21.0, 23.0])
    assert [(r["pass"], r["step"]) for r in steps] == [("fwd", 0), ("fwd", 1), ("bwd", 0)]
    assert steps[0]["kernel"] == (10.0, 15.0) and steps[0]["wait"] == (5.0, 5.0) and "wait" not in steps[1]
    assert totals[0]["total"] == pytest.approx(20.1) and totals[1]["total"] == pytest.approx(22.3)
    assert totals[0]["imbalance"] == pytest.approx(7.0) and totals[1]["imbalance"] == 0.0
    assert [t["call"] for t in totals] == [21.0, 23.0]


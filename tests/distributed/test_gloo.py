"""Ring, zigzag, Ulysses and USP on 2 and 4 gloo processes: every rank against one device and the exact result.

Each world size is one spawn running all its cases (process start-up dominates on small CPUs).
fp32 cases must match the single-device result to 1e-5 on every rank and tensor; bf16 cases must pass
the verdict (error vs exact within 2.5x the single-device error + 2 ulp).
"""

from __future__ import annotations

import pytest
from cp_workers import run_cases

TENSORS = ("out", "dq", "dk", "dv")

DOCS = (13, 70, 5, 40)  # packed documents: a short one, one across the middle of the sequence
# name: (method, kernel, dtype, causal, heads_q, heads_kv, seq_len, extra)
CASES_2 = {
    "ring-fp32": ("ring", "sdpa-math", "fp32", False, 4, 4, 64, {"batch": 2}),
    "ring-fp32-causal-gqa": ("ring", "sdpa-math", "fp32", True, 4, 2, 64, {}),
    "zigzag-fp32-causal": ("zigzag", "sdpa-math", "fp32", True, 4, 4, 64, {}),
    "zigzag-fp32-gqa": ("zigzag", "sdpa-math", "fp32", False, 4, 1, 64, {}),
    "zigzag-fp32-causal-odd": ("zigzag", "sdpa-math", "fp32", True, 4, 4, 68, {"head_dim": 8}),
    "zigzag-fp32-causal-allgather": ("zigzag", "sdpa-math", "fp32", True, 4, 2, 64, {"comm": "allgather"}),
    "ulysses-fp32-causal-gqa": ("ulysses", "sdpa-math", "fp32", True, 4, 2, 64, {}),
    "ulysses-fp32-causal-4-chunks": ("ulysses", "sdpa-math", "fp32", True, 16, 8, 64, {"ulysses_chunks": "auto"}),
    "ulysses-bf16-gqa-2-chunks": ("ulysses", "sdpa-math", "bf16", False, 8, 4, 128, {"ulysses_chunks": 2}),
    "ring-bf16-causal": ("ring", "sdpa-math", "bf16", True, 4, 4, 128, {}),
    "zigzag-bf16-causal-gqa": ("zigzag", "sdpa-math", "bf16", True, 4, 2, 128, {}),
    "ring-cpuflash-fp32-causal": ("ring", "sdpa-flash", "fp32", True, 4, 4, 64, {}),
    "zigzag-cpuflash-bf16-causal": ("zigzag", "sdpa-flash", "bf16", True, 4, 4, 128, {}),
    "ring-docs-fp32-causal": ("ring", "sdpa-math", "fp32", True, 4, 4, 128, {"docs": DOCS}),
    "zigzag-docs-fp32-causal-gqa": ("zigzag", "sdpa-math", "fp32", True, 4, 2, 128, {"docs": DOCS}),
    "zigzag-docs-bf16-causal": ("zigzag", "sdpa-math", "bf16", True, 4, 4, 128, {"docs": DOCS}),
    "ulysses-docs-fp32-causal-gqa": ("ulysses", "sdpa-math", "fp32", True, 4, 2, 128, {"docs": DOCS}),
    "ulysses-docs-fp32-2-chunks": ("ulysses", "sdpa-math", "fp32", False, 8, 4, 128, {"docs": DOCS,
                                                                                       "ulysses_chunks": 2}),
    "reject-zigzag-length": ("zigzag", "sdpa-math", "fp32", True, 4, 4, 66, {}),
    "reject-usp-docs": ("usp", "sdpa-math", "fp32", True, 4, 4, 128, {"docs": DOCS}),
    "blind-zigzag-docs": ("zigzag", "sdpa-math", "bf16", True, 4, 4, 128, {"docs": DOCS, "ignore_docs": True}),
    "reject-ulysses-heads": ("ulysses", "sdpa-math", "fp32", False, 3, 3, 64, {}),
}
CASES_4 = {
    "ring-fp32-causal": ("ring", "sdpa-math", "fp32", True, 4, 4, 64, {}),
    "zigzag-fp32-allgather": ("zigzag", "sdpa-math", "fp32", False, 4, 4, 64, {"comm": "allgather"}),
    "zigzag-bf16-causal-gqa": ("zigzag", "sdpa-math", "bf16", True, 4, 2, 128, {}),
    "ulysses-fp32": ("ulysses", "sdpa-math", "fp32", False, 4, 4, 64, {}),
    "usp2x2-fp32-causal-gqa": ("usp", "sdpa-math", "fp32", True, 4, 2, 64, {"ulysses_degree": 2}),
    "usp2x2-bf16": ("usp", "sdpa-math", "bf16", False, 4, 2, 128, {"ulysses_degree": 2}),
    # one document over every zigzag chunk: rank 0's diagonal block holds it in two runs
    "zigzag-docs-fp32-causal-across": ("zigzag", "sdpa-math", "fp32", True, 4, 2, 256, {"docs": (10, 230, 16)}),
    "ring-docs-bf16": ("ring", "sdpa-math", "bf16", False, 4, 4, 256, {"docs": (100, 3, 1, 152)}),
}


def _as_list(cases: dict) -> list:
    return [(name, *spec) for name, spec in cases.items()]


@pytest.fixture(scope="module")
def results2():
    return run_cases(2, _as_list(CASES_2))


@pytest.fixture(scope="module")
def results4():
    return run_cases(4, _as_list(CASES_4))


def _assert_case(res: dict, name: str, dtype: str, world: int) -> None:
    per_rank = res["per_rank"]
    assert len(per_rank) == world
    for rank, errs in enumerate(per_rank):
        for t in TENSORS:
            e = errs[t]
            if dtype == "fp32":
                assert e["max"] <= 1e-5, f"{name} rank {rank} {t}: {e['max']:.3g} vs single device"
            assert e["pass"], f"{name} rank {rank} {t}: {e['err_vs_exact']:.3g} > bound {e['bound']:.3g}"
            assert e["mean"] <= e["max"]


@pytest.mark.parametrize("name", [n for n in CASES_2 if not n.startswith(("reject", "blind"))])
def test_two_ranks(results2, name):
    _assert_case(results2[name], name, CASES_2[name][2], 2)


@pytest.mark.parametrize("name", list(CASES_4))
def test_four_ranks(results4, name):
    _assert_case(results4[name], name, CASES_4[name][2], 4)


def test_layouts_reported(results2, results4):
    assert results2["zigzag-fp32-causal"]["layout"] == "zigzag"
    assert results2["ring-fp32"]["layout"] == "contiguous"
    assert results4["usp2x2-fp32-causal-gqa"]["layout"] == "zigzag"  # zigzag over the ring, nested


def test_causal_ring_is_not_trivially_exact(results2):
    # Rank 1 of a causal ring merges two blocks: its result differs from one device in the last bits,
    # proving the merge path ran (rank 0 only has its diagonal block).
    errs = results2["ring-fp32-causal-gqa"]["per_rank"]
    assert errs[1]["out"]["max"] > 0


def test_rejects_length_not_divisible(results2):
    msg = results2["reject-zigzag-length"]["error"]
    assert "66" in msg and "multiple of 4" in msg and "64 or 68" in msg


def test_rejects_heads_not_divisible(results2):
    msg = results2["reject-ulysses-heads"]["error"]
    assert "q-heads (3)" in msg and "kv-heads (3)" in msg and "multiple of 2" in msg


def test_a_method_blind_to_packed_documents_fails_the_check(results2):
    per_rank = results2["blind-zigzag-docs"]["per_rank"]
    assert not all(t["pass"] for errs in per_rank for t in errs.values())
    assert all(not errs["out"]["pass"] for errs in per_rank)  # every rank holds queries of a cut document


def test_packed_documents_are_refused_by_the_methods_that_do_not_split_them(results2):
    assert results2["reject-usp-docs"]["error"] == ("packed documents (a group of lengths) run on ring, zigzag, "
                                                   "ulysses, ulysses-ce, torch-cp-flex; usp does not take them")


def test_a_dist_record_carries_the_slowest_ranks_clock_and_any_drop():
    # The call waits for the slowest rank, so the record's clock (what the views' SM MHz column shows) is that
    # rank's; a drop on any rank is flagged; a CPU, reading none, adds nothing.
    from attnbench.distributed.bench import clock_info
    from attnbench.results.record import clock_of
    steady = {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1980}}
    warm = {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1755}}
    info = clock_info([steady, warm])
    assert clock_of(info) == (1755, True) and info["gpu_state_per_rank"] == [steady, warm]
    assert clock_info([steady, steady]) == {"gpu_state": steady, "gpu_state_per_rank": [steady, steady]}
    assert clock_info([{"start": {}, "end": {}}] * 2) == {}


def test_the_case_output_says_each_ranks_clock_where_the_gpus_report_one(capsys):
    from attnbench.cli import dist as dist_cli
    from attnbench.distributed import bench
    from attnbench.spec import AttnSpec
    states = [{"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1980}},
              {"start": {"sm_clock_mhz": 1980}, "end": {"sm_clock_mhz": 1755}}]
    res = bench.CaseResult(spec=AttnSpec(), method="ulysses", kernel="fa3",
                           info=bench.clock_info(states))
    dist_cli._print_case(res, 2)
    out = capsys.readouterr().out
    assert "SM clock after the timed calls, by rank: 1980, 1755 MHz (fell by over 10% on a rank while timed)" in out
    dist_cli._print_case(bench.CaseResult(spec=AttnSpec(), method="ring", kernel="sdpa-math"), 2)
    assert "SM clock" not in capsys.readouterr().out  # a CPU run reads none

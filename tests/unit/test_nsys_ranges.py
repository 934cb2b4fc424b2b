"""Kernels per NVTX range from an nsys SQLite export (attnbench.timing.nsys.launches_in_ranges, step_summary),
on a small profile written in nsys' export schema: two steps of two backends, attention ranges inside."""

from __future__ import annotations

import sqlite3

import pytest

from attnbench.timing.nsys import launches_in_ranges, step_summary

MAIN, OTHER = 1001, 1002  # host threads (globalTid)


def _profile(path, ranges, kernels):
    """ranges: (name, start, end, tid); kernels: (name, launch start, tid, device ns)."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, textId INT, globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, correlationId INT, globalTid INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, correlationId INT, demangledName INT);
    """)
    names = {}
    for i, (name, start, end, tid) in enumerate(ranges):
        if i % 2:  # nsys stores a range's name either inline or as a registered string
            names.setdefault(name, len(names) + 1)
            con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, NULL, ?, ?)", (start, end, names[name], tid))
        else:
            con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, NULL, ?)", (start, end, name, tid))
    con.execute("INSERT INTO NVTX_EVENTS VALUES (0, NULL, 34, 'a mark, not a range', NULL, ?)", (MAIN,))
    for corr, (name, launch, tid, dur) in enumerate(kernels):
        names.setdefault(name, len(names) + 1)
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (launch, launch + 5, corr, tid))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)",
                    (launch + 1000, launch + 1000 + dur, corr, names[name]))
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, n) for n, i in names.items()])
    con.commit()
    con.close()


def test_kernels_are_counted_in_the_step_and_attention_range_that_launched_them(tmp_path):
    ranges = [("step0", 100, 200, MAIN), ("attn:fa2", 110, 120, MAIN), ("step1", 300, 400, MAIN),
              ("attn:fa2", 310, 320, MAIN), ("step0", 500, 600, MAIN), ("attn:sage", 510, 530, MAIN),
              ("attn:sage", 540, 560, OTHER)]  # a range on another thread holds none of MAIN's launches
    kernels = [("flash_fwd_kernel", 115, MAIN, 4_000_000), ("direct_copy_kernel_cuda", 150, MAIN, 1_000_000),
               ("CUDAFunctor_add<float>", 160, MAIN, 500_000), ("flash_fwd_kernel", 315, MAIN, 4_000_000),
               ("gemm", 350, MAIN, 2_000_000), ("qk_int8_sv_f8", 520, MAIN, 2_000_000),
               ("direct_copy_kernel_cuda", 545, MAIN, 1_000_000), ("warm-up outside any step", 50, MAIN, 9_000_000),
               ("autograd thread kernel", 550, OTHER, 1_000_000)]
    _profile(tmp_path / "p.sqlite", ranges, kernels)
    launches = launches_in_ranges(tmp_path / "p.sqlite")
    assert [k["name"] for k in launches][0] == "warm-up outside any step" and launches[0]["ranges"] == []
    assert [n for n, _ in launches[1]["ranges"]] == ["step0", "attn:fa2"]

    steps = step_summary(launches)
    assert [(s["step"], s["backend"]) for s in steps] == [("step0", "fa2"), ("step1", "fa2"), ("step0", "sage")]
    first, second, sage = steps
    assert (first["kernels"], first["attn_kernels"]) == (3, 1)
    assert first["attn_ms"] == pytest.approx(4.0) and first["kernels_ms"] == pytest.approx(5.5)
    assert (first["copy_kernels"], first["copy_ms"], first["add_kernels"]) == (1, pytest.approx(1.0), 1)
    assert second["kernels_ms"] == pytest.approx(6.0) and second["copy_kernels"] == 0
    # MAIN's copy at 545 is outside MAIN's attention range (its 540-560 range is on OTHER's thread)
    assert (sage["kernels"], sage["attn_kernels"], sage["attn_ms"]) == (2, 1, pytest.approx(2.0))


def test_a_profile_without_kernels_is_refused(tmp_path):
    con = sqlite3.connect(tmp_path / "p.sqlite")
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.close()
    with pytest.raises(ValueError, match="no CUDA kernels"):
        launches_in_ranges(tmp_path / "p.sqlite")

"""Profiler command lines and parsing of their recorded outputs (ncu, nsys, rocprofv3), and the
marked launch sequence that cuts a flat kernel trace into calls."""

from pathlib import Path

import pytest

from attnbench.timing import marked, ncu, nsys, rocprof

FIXTURES = Path(__file__).parent / "fixtures" / "profilers"
F, M = "fill<int>", "bitwise_not<int>"


def test_split_marked_cold_drops_flush_by_position_even_if_closure_fills():
    # The closure itself launches a kernel with the flush's exact name: it must be kept.
    trace = [(F, 0.05), (M, 0.001),
             (F, 0.05), (M, 0.001), (F, 0.002), ("attn", 1.0),
             (F, 0.05), (M, 0.001), (F, 0.002), ("attn", 1.1),
             (F, 0.05), (M, 0.001)]
    (calls,) = marked.split_marked(trace, [2], cold=True)
    assert calls == [[(F, 0.002), ("attn", 1.0)], [(F, 0.002), ("attn", 1.1)]]
    assert marked.iteration_times_ms(calls) == pytest.approx([1.002, 1.102])
    assert marked.kernel_names(calls) == [F, "attn"]


def test_split_marked_several_blocks_warm():
    trace = [(M, 0), (M, 0), ("a", 1.0), (M, 0), ("a", 2.0), (M, 0),          # block 1: 2 calls
             (M, 0), (M, 0), ("b1", 3.0), ("b2", 4.0), (M, 0)]                # block 2: 1 call
    blocks = marked.split_marked(trace, [2, 1], cold=False)
    assert [marked.iteration_times_ms(b) for b in blocks] == [[1.0, 2.0], [7.0]]


@pytest.mark.parametrize("trace, iterations", [
    ([(M, 0), (M, 0), ("a", 1), (M, 0)], [2]),                    # a call missing
    ([(M, 0), (M, 0), ("a", 1), (M, 0), ("stray", 1)], [1]),      # kernels after the terminator
    ([(M, 0), ("early", 1), (M, 0), ("a", 1), (M, 0)], [1]),      # kernels before the first call
    ([], [1]),
])
def test_split_marked_refuses_to_guess(trace, iterations):
    with pytest.raises(ValueError):
        marked.split_marked(trace, iterations, cold=False)


def test_split_marked_cold_requires_flush_at_segment_end():
    trace = [(F, 1), (M, 0), (F, 1), (M, 0), ("a", 1), (M, 0)]  # last segment lacks its flush
    with pytest.raises(ValueError, match="flush"):
        marked.split_marked(trace, [1], cold=True)


def test_ncu_command_has_clock_control_filter_and_metric():
    cmd = ncu.ncu_command(["python3", "-m", "attnbench.timing.child", "job.json"], ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu" and cmd[-4:] == ["python3", "-m", "attnbench.timing.child", "job.json"]
    joined = " ".join(cmd)
    assert "--clock-control none" in joined and "--metrics gpu__time_duration.sum" in joined
    assert "--csv" in cmd and "--nvtx" in cmd and "--nvtx-include attnbench_timed/" in joined
    assert "--print-units base" in joined


def test_ncu_csv_parses_to_kernels_in_launch_order_and_splits():
    kernels = ncu.parse_ncu_csv((FIXTURES / "ncu_fwd_two_calls.csv").read_text())
    assert len(kernels) == 8
    assert kernels[3][0].startswith("void pytorch_flash::flash_fwd_kernel<")
    assert kernels[3][1] == pytest.approx(1.204512)  # "1,204,512" ns
    (calls,) = marked.split_marked(kernels, [2], cold=False)
    assert marked.iteration_times_ms(calls) == pytest.approx([1.206656, 1.20096])
    assert any("flash_fwd" in n for n in marked.kernel_names(calls))


def test_ncu_csv_units_and_errors():
    head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    text = head + '"1","k2","gpu__time_duration.sum","usecond","12.5"\n"0","k1","gpu__time_duration.sum","msecond","1"\n'
    assert ncu.parse_ncu_csv(text) == [("k1", 1.0), ("k2", 0.0125)]
    with pytest.raises(ValueError, match="no ncu CSV"):
        ncu.parse_ncu_csv("==PROF== No kernels were profiled.\n")
    with pytest.raises(ValueError, match="unit"):
        ncu.parse_ncu_csv(head + '"0","k","gpu__time_duration.sum","cycle","3"\n')


def test_nsys_commands_and_argument_stripping():
    argv = ["run", "--profiler", "nsys", "--seq-lens", "4k", "--profiler=nsys", "--backends", "sdpa-flash"]
    assert nsys.strip_profiler_args(argv) == ["run", "--seq-lens", "4k", "--backends", "sdpa-flash"]
    cmd = nsys.profile_command(argv, "/tmp/out/attnbench", nsys="nsys")
    assert cmd[:2] == ["nsys", "profile"] and "--trace=cuda,nvtx" in cmd
    assert cmd[-2:] == ["--profiler", "none"] and "nsys" not in cmd[cmd.index("attnbench"):]
    stats = nsys.stats_command("/tmp/out/attnbench.nsys-rep", "/tmp/out/attnbench")
    assert stats[:2] == ["nsys", "stats"] and "nvtx_gpu_proj_sum" in stats and "nvtx_sum" in stats
    assert stats[stats.index("--format") + 1] == "csv" and stats[-1].endswith(".nsys-rep")


def test_nsys_stats_parse_and_merge():
    gpu = nsys.parse_stats_csv((FIXTURES / "nsys_nvtx_gpu_proj_sum.csv").read_text())
    cpu = nsys.parse_stats_csv("Processing [a.sqlite] with [nvtx_sum.py]...\n\n"
                               + (FIXTURES / "nsys_nvtx_sum.csv").read_text())
    assert gpu[0]["range"] == "sdpa-flash b2 s4096 h16 d128 bf16 fwd" and gpu[0]["total_ms"] == pytest.approx(512.345678)
    assert {r["range"]: r["instances"] for r in cpu}["timing"] == 2
    rows = {r["range"]: r for r in nsys.merge(gpu, cpu)}
    assert rows["timing"]["gpu_avg_ms"] == pytest.approx(249.382716)
    assert rows["timing"]["range_avg_ms"] == pytest.approx(651.172839)
    assert rows["check"]["gpu_total_ms"] is None and rows["check"]["range_avg_ms"] == pytest.approx(4.0)
    with pytest.raises(ValueError):
        nsys.parse_stats_csv("Time (%),Total Time (ns),Name\n1,2,x\n")


def test_nsys_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(nsys, "find_nsys", lambda: None)
    with pytest.raises(FileNotFoundError, match="nsys"):
        nsys.run_under_nsys(["run"], tmp_path)


def test_rocprof_command():
    cmd = rocprof.rocprof_command(["python3", "-m", "x"], "/tmp/o")
    assert cmd[0] == "rocprofv3" and "--kernel-trace" in cmd and "--marker-trace" in cmd
    assert cmd[cmd.index("--output-format") + 1] == "csv" and cmd[cmd.index("-d") + 1] == "/tmp/o"
    assert cmd[cmd.index("--") + 1:] == ["python3", "-m", "x"]


def test_rocprof_outputs_parse_inside_timed_range(tmp_path):
    out = tmp_path / "host" / "4242"
    out.mkdir(parents=True)
    for name in ("kernel_trace", "marker_api_trace"):
        (out / f"attnbench_{name}.csv").write_text((FIXTURES / f"rocprofv3_{name}.csv").read_text())
    kernels = rocprof.parse_outputs(tmp_path)
    assert len(kernels) == 10  # the warm-up kernel before and the one after the range are excluded
    (calls,) = marked.split_marked(kernels, [2], cold=True)
    assert marked.iteration_times_ms(calls) == pytest.approx([0.445, 0.450])
    assert "FmhaFwdKernel" in marked.kernel_names(calls)[0]


def test_rocprof_missing_outputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        rocprof.parse_outputs(tmp_path)


def test_the_external_child_draws_the_same_inputs_as_the_run(monkeypatch):
    """--input-scale / --outliers reach the child process that ncu or rocprof times."""
    import json as _json
    import subprocess as _subprocess

    from attnbench.spec import AttnSpec
    from attnbench.timing import external

    seen = {}

    def fake_run(cmd, **kwargs):
        seen["job"] = _json.loads(open(cmd[-1]).read())
        return _subprocess.CompletedProcess(cmd, 1, "", "no result")
    monkeypatch.setattr(external, "find_tool", lambda tool: "/opt/ncu")
    monkeypatch.setattr(external.subprocess, "run", fake_run)
    case = external.ExternalCase(spec=AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16), backend="naive", iterations=3)
    with pytest.raises(RuntimeError, match="run failed"):
        external.run_external("ncu", [case], device="cuda", seed=3, inputs={"scale": 4.0, "outliers": 0.001})
    assert seen["job"]["inputs"] == {"scale": 4.0, "outliers": 0.001} and seen["job"]["seed"] == 3

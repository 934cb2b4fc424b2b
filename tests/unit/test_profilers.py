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


def test_kernel_times_are_per_call_medians_with_repeated_launches_summed():
    calls = [[("quant", 0.1), ("attn", 1.0), ("quant", 0.1)],
             [("quant", 0.3), ("attn", 2.0)],
             [("attn", 3.0), ("extra", 0.5)]]
    times = marked.kernel_times_ms(calls)
    assert list(times) == ["quant", "attn", "extra"]
    assert times["quant"] == pytest.approx(0.2)   # per call 0.2, 0.3, 0 -> median 0.2
    assert times["attn"] == pytest.approx(2.0)
    assert times["extra"] == pytest.approx(0.0)   # launched in one call of three


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


def test_nsys_commands():
    child = ["python3", "-m", "attnbench.timing.child", "/tmp/job.json"]
    cmd = nsys.profile_command(child, "/tmp/out/trace", nsys="nsys")
    assert cmd[:2] == ["nsys", "profile"] and "--trace=cuda,nvtx" in cmd and cmd[-len(child):] == child
    assert cmd[cmd.index("--output") + 1] == "/tmp/out/trace"
    stats = nsys.stats_command("/tmp/out/trace.nsys-rep", "/tmp/out/trace")
    assert stats[:2] == ["nsys", "stats"] and "cuda_gpu_trace" in stats and "nvtx_pushpop_trace" in stats
    assert stats[stats.index("--format") + 1] == "csv" and stats[-1].endswith(".nsys-rep")


def test_nsys_trace_parses_inside_the_timed_range_and_splits(tmp_path):
    for name in nsys.REPORTS:
        (tmp_path / f"trace_{name}.csv").write_text((FIXTURES / f"nsys_{name}.csv").read_text())
    kernels = nsys.parse_outputs(tmp_path, "trace")
    # the warm-up kernel before the range, the one after it, a memcpy and a memset are not timed kernels
    assert len(kernels) == 10 and not any(name.startswith("[CUDA") for name, _ in kernels)
    (calls,) = marked.split_marked(kernels, [2], cold=True)
    assert marked.iteration_times_ms(calls) == pytest.approx([0.245, 0.250])
    assert "flash_fwd_kernel" in marked.kernel_names(calls)[0]
    assert nsys.timed_windows((FIXTURES / "nsys_nvtx_pushpop_trace.csv").read_text()) == [(2050000, 3100000)]
    (tmp_path / "trace_nvtx_pushpop_trace.csv").write_text("Start (ns),End (ns),Name\n1,2,:other\n")
    with pytest.raises(ValueError, match="no range 'attnbench_timed'"):
        nsys.parse_outputs(tmp_path, "trace")


def test_nsys_missing_outputs_and_tool(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="cuda_gpu_trace"):
        nsys.parse_outputs(tmp_path, "trace")
    monkeypatch.setattr("shutil.which", lambda name: None)
    from attnbench.timing import external
    with pytest.raises(FileNotFoundError, match="nsys is not installed"):
        external.run_external("nsys", [], device="cuda")


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

"""What a user reads and copies, laid out for 100 columns: tables that keep run ids and case labels whole, cells
that show their numbers, marks that are explained, units and words that say what they mean."""

from __future__ import annotations

import pytest
from results_fixtures import cli, synthetic_record
from rich.console import Console

from attnbench.accuracy.tolerance import Tolerance
from attnbench.cli import common
from attnbench.report import grid
from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

WIDTH = 100


@pytest.fixture(autouse=True)
def hundred_columns(monkeypatch):
    """Every console the CLI prints through is 100 columns wide, as a pipe with COLUMNS=100 is."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "width", WIDTH)


def widest(text: str) -> int:
    return max((len(line.rstrip()) for line in text.splitlines()), default=0)


def test_runs_keeps_every_run_id_on_one_line(tmp_path):
    db = tmp_path / "r.db"
    long_command = ("attnbench run --device cuda --backends fa2,fa3,flashinfer,sdpa-flash --seq-lens 512..16k:x2 "
                    "--preset gpt-oss-20b --db /a/long/path/to/the/results/attnbench.db")
    ids = ["20261128-034310-adbdc0", "20261128-034311-adbdc1"]
    with ResultStore(db) as store:
        store.add_env("e1", {"device_name": "NVIDIA H100 80GB HBM3"})
        for run_id in ids:
            store.start_run(run_id, command=long_command, config={}, env_id="e1", version="test")
            store.finish_run(run_id)
    res = cli("runs", "--db", db)
    assert res.returncode == 0, res.stderr
    assert all(run_id in res.stdout for run_id in ids)  # whole, where a user copies them from
    assert widest(res.stdout) <= WIDTH


def test_runs_is_one_line_per_run(tmp_path):
    db = tmp_path / "r.db"
    commands = ["attnbench run", "attnbench run --preset qwen3-next-80b --seq-lens 4k 16k",
                "attnbench dist --nproc 2 --device cpu --method ring,zigzag,ulysses --kernel sdpa-math --seq-lens 256",
                "attnbench run --device cpu --batch 2q64_4q1kv128 --page-size 16 --backends naive --skip-missing"]
    ids = [f"20261128-0343{i:02d}-adbdc{i:x}" for i in range(14)]
    with ResultStore(db) as store:
        store.add_env("gpu", {"device_name": "NVIDIA H100 80GB HBM3"})
        store.add_env("cpu", {"device_name": "AMD EPYC 7B13 64-Core Processor"})
        for i, run_id in enumerate(ids):
            store.start_run(run_id, command=commands[i % 4], config={}, env_id=("gpu", "cpu")[i % 2], version="t")
            store.plan_cases(run_id, 736)
            store.finish_run(run_id, "interrupted" if i % 3 else "done")
    res = cli("runs", "--db", db)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines if line[:1].isdigit()] == ids  # each run's row on one line
    assert len(lines) == len(ids) + 4 and widest(res.stdout) <= WIDTH  # title, header, rule, the --full hint
    row = next(line for line in lines if line.startswith(ids[1]))
    assert "AMD EPYC" in row and "0/736" in row and "interrupted" in row and row.split()[-1].endswith("…")
    full = cli("runs", "--db", db, "--full")
    assert "64-Core Processor" in full.stdout and "--skip-missing" in full.stdout and widest(full.stdout) <= WIDTH


def _case_lines(text: str) -> list[list[str]]:
    """The lines of each row's case in a ``--table`` printout (the text under the "case" header)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if " case " in line and " pass " in line)
    start, end = lines[head].index("case"), lines[head].index("pass")
    rows: list[list[str]] = []
    for line in lines[head + 2:]:
        if line[:start].strip():
            rows.append([])
        if rows and line[start:end].strip():
            rows[-1].append(line[start:end].strip())
    return rows


SERVING = AttnSpec(seqlens_q=(2048, 2048) + (1,) * 32, seqlens_k=(2048, 2048) + (1024,) * 32, heads_q=4, heads_kv=2,
                   head_dim=32, dtype="fp32", causal=True, pass_="fwd", sinks=True, softcap=50.0, window=(128, 0),
                   page_size=16)
"""A serving batch (--batch 2q2k_32q1kv1k) of a model with every variant: a label of 76 characters."""


def _store_serving_run(db, specs: list[AttnSpec]) -> None:
    reason = "varlen (grouped sequences) not supported by this kernel, whatever the lengths"
    with ResultStore(db) as store:
        store.start_run("serving", command="attnbench run --batch 2q2k_32q1kv1k", config={}, env_id=None,
                        version="test")
        for spec in specs:
            store.write(synthetic_record("serving", spec, "naive", [2.0, 2.1, 2.2],
                                         accuracy={"verdict": "pass"}, info={"cpu": {"busy": True}}))
            store.write(synthetic_record("serving", spec, "sdpa-flash", [1.0], status="unsupported",
                                         reason=reason))
        store.finish_run("serving")


def test_show_table_keeps_a_serving_case_on_two_lines_at_most(tmp_path):
    db = tmp_path / "s.db"
    _store_serving_run(db, [SERVING, SERVING.replace(page_size=None, softcap=None)])
    res = cli("show", "--db", db, "--table")
    assert res.returncode == 0, res.stderr
    assert widest(res.stdout) <= WIDTH
    rows = _case_lines(res.stdout)
    assert len(rows) == 4 and all(1 <= len(lines) <= 2 for lines in rows), rows
    assert all(lines[0].startswith("b1 reqs[2q2k_32q1kv1k]") for lines in rows)  # the requests, unbroken
    shown = " ".join(" ".join(lines) for lines in rows) + " " + res.stdout.splitlines()[0]
    for word in SERVING.label().split():  # every word of the label: in its row, or in the title when all share it
        assert word in shown


def test_a_trace_step_is_named_by_its_requests_counted_not_spelled_out(tmp_path):
    lens = [1, 1, 77, 300] * 10
    step = AttnSpec(seqlens_q=tuple(lens), seqlens_k=tuple(q + 37 * i for i, q in enumerate(lens)), heads_q=4,
                    head_dim=32, dtype="fp32", causal=True, pass_="fwd")
    db = tmp_path / "t.db"
    _store_serving_run(db, [step])
    res = cli("show", "--db", db, "--table")
    rows = _case_lines(res.stdout)
    assert all(len(lines) <= 2 for lines in rows), rows
    assert " ".join(rows[0]).startswith("b1 reqs[40:q1..300,kv1..1743]")


def test_show_table_sets_the_busy_mark_apart_from_the_verdict(tmp_path):
    db = tmp_path / "b.db"
    _store_serving_run(db, [SERVING.replace(seqlens_q=(64,), seqlens_k=(64,), page_size=None)])
    res = cli("show", "--db", db, "--table")
    assert " pass ? " in res.stdout and "pass?" not in res.stdout


def _checked(backend: str, spec: AttnSpec, ratio: float, **fields) -> Record:
    limits = {"out": {"max_abs": 1e-3}, "dq": {"max_abs": 1e-3}}
    return Record(run_id="v", backend=backend, spec=spec, accuracy={
        "verdict": "pass" if ratio <= 1 else "fail", "limits": limits,
        "tensors": {"out": {"max_abs": ratio * 1e-3}, "dq": {"max_abs": 1e-4}}}, **fields)


def _preset_cases() -> list[AttnSpec]:
    """gpt-oss-20b's layers at eight lengths: 16 cases, as `verify --preset gpt-oss-20b` checks on a GPU."""
    return [AttnSpec(seqlens_q=(s,), heads_q=64, heads_kv=8, head_dim=64, dtype="bf16", causal=True, sinks=True,
                     window=w, pass_="fwd_bwd") for s in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
            for w in (None, (127, 0))]


def _render_grid(records: list[Record]) -> str:
    console = Console(width=WIDTH, force_terminal=False)
    with console.capture() as cap:
        grid.render(records, console)
    return cap.get()


def test_verify_grid_shows_every_number_within_100_columns():
    specs = _preset_cases()
    records = [_checked(b, spec, 0.27 + 0.01 * i) for b in ("naive", "sdpa-math", "flashinfer")
               for i, spec in enumerate(specs)]
    text = _render_grid(records)
    assert widest(text) <= WIDTH and "…" not in text
    assert ".27" in text and ".42" in text  # the numbers, not 0… in every cell
    names = grid.case_names(records)
    legend = [line for line in text.splitlines() if line.startswith(("cases: ", "       "))]
    for i, name in enumerate(names.values()):  # each case whole on one line of the legend
        assert any(f"{i + 1} {name}" in line for line in legend), (i, name, legend)
    assert "ᶠ" not in text and "✗" not in text  # no mark is shown, so none is explained
    assert "2 x the error of PyTorch math" in " ".join(text.split())  # k, from the Tolerance


def test_verify_grid_splits_cases_that_do_not_fit_and_explains_the_marks_it_shows():
    specs = _preset_cases()
    records = [_checked("naive", spec, 0.5) for spec in specs]
    records += [_checked("flash-forward-only", spec.replace(pass_="fwd"), 12.0 if i == 3 else 0.5, status="mismatch"
                         if i == 3 else "ok") for i, spec in enumerate(specs)]
    text = _render_grid(records)
    assert widest(text) <= WIDTH and "…" not in text
    tables = [line for line in text.splitlines() if line.startswith("backend")]
    assert len(tables) == 2 and "16" in tables[1] and "16" not in tables[0]  # two tables of eight cases
    assert "12ᶠ✗" in text
    flat = " ".join(text.split())
    assert "✗ failed its check" in flat and "ᶠ forward only" in flat
    assert f"{Tolerance().k_max:g} x for the largest element" in flat


def _cpu_rates_run(db) -> list[Record]:
    """A CPU run's rates (0.001-0.06 TFLOP/s) at three lengths, two kernels, stored."""
    records = []
    with ResultStore(db) as store:
        store.start_run("cpu", command="attnbench run --device cpu", config={}, env_id=None, version="test")
        for s, tflops in ((128, 0.001), (256, 0.02), (512, 0.06)):
            spec = AttnSpec(seqlens_q=(s,), heads_q=4, head_dim=64, dtype="fp32", pass_="fwd")
            for backend, factor in (("naive", 1.0), ("sdpa-math", 0.5)):
                record = synthetic_record("cpu", spec, backend, [1.0, 1.1, 1.2], tflops=tflops * factor,
                                          accuracy={"verdict": "pass"})
                store.write(record)
                records.append(record)
        store.finish_run("cpu")
    return records


def test_one_unit_for_a_cpu_runs_rates_in_every_view(tmp_path):
    from attnbench.cli.e2e import e2e_table
    from attnbench.report import html, plots, summary
    db = tmp_path / "u.db"
    records = _cpu_rates_run(db)
    assert summary.build(records).unit == "GF/s"
    with ResultStore(db) as store:
        rows = store.rows("cpu")
        page = html.build(store, ["cpu"])
    fig = plots.figure(rows, "seq_len", "tflops")
    assert fig.axes[0].get_ylabel() == "throughput (GFLOP/s)"
    assert max(max(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()) == pytest.approx(60.0)
    assert "<th>GFLOP/s</th>" in page and "TFLOP/s" not in page
    for r, value in zip(records[:2], (0.0005, 0.002), strict=True):
        r.info["e2e"] = {"attn_tflops": value}
    console = Console(width=WIDTH, force_terminal=False)
    with console.capture() as cap:
        console.print(e2e_table(records[:2], "llama-tiny prefill on cpu"))
    line = next(line for line in cap.get().splitlines() if line.split()[:1] == ["Attn"] and "(" not in line)
    assert line.split()[:4] == ["Attn", "GFLOP/s", "0.500", "2.00"]


def test_dist_tables_fit_100_columns_and_mark_a_busy_cpus_numbers(capsys):
    from attnbench.cli import dist
    from attnbench.distributed.bench import CaseResult

    def result(seq: int, busy: bool) -> CaseResult:
        spec = AttnSpec(seqlens_q=(seq,), heads_q=4, head_dim=16, dtype="fp32", causal=True, pass_="fwd_bwd")
        return CaseResult(spec=spec, method="zigzag", kernel="sdpa-math", stats={"median_ms": 4.68},
                          tflops_per_device=0.00094, info={"cpu": {"threads": 1, "busy": busy}})

    dist._print_tables([result(131072, True), result(256, False)], 2)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert widest(out) <= WIDTH
    assert lines[2].endswith("| MB/device | GFLOP/s |")  # the rate in a CPU's unit: 0.940, not 0.00094 TFLOP/s
    busy, calm = (line for line in lines if line.startswith("| 1 |"))
    assert busy == "| 1 | 131072 | 4 | 16 | False | 213.675 ? | 4.680 ? | n/a | 0.940 ? |"
    assert calm == "| 1 | 256 | 4 | 16 | False | 213.675 | 4.680 | n/a | 0.940 |"
    assert lines[-1] == dist.BUSY_NOTE


def test_dist_tables_say_the_mask_when_a_run_has_both_settings(capsys):
    from attnbench.cli import dist
    from attnbench.distributed.bench import CaseResult

    def result(causal: bool) -> CaseResult:
        spec = AttnSpec(seqlens_q=(256,), heads_q=4, head_dim=16, dtype="fp32", causal=causal, pass_="fwd_bwd")
        return CaseResult(spec=spec, method="ring", kernel="sdpa-math", stats={"median_ms": 4.68},
                          tflops_per_device=0.00094, info={})

    dist._print_tables([result(True), result(False)], 2)
    out = capsys.readouterr().out
    titles = [line for line in out.splitlines() if line.startswith("### ")]
    assert titles == ["### cp-ring:sdpa-math on 2 ranks, causal", "### cp-ring:sdpa-math on 2 ranks, not causal"]
    assert out.count("| batch | seq_len | heads | head_size | fwd_only | iters/s |") == 2  # the write-up's columns
    dist._print_tables([result(True)], 2)  # one setting: one table, its title as before
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("### ")] == [
        "### cp-ring:sdpa-math on 2 ranks"]


def test_the_grouped_case_note_counts_the_backends_that_skip_every_grouped_case():
    from attnbench.report.footnotes import grouped_note
    group = AttnSpec(seqlens_q=(64, 96), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")
    records = []
    for backend in ("naive", "sdpa-flash", "flex-sparse", "sdpa-efficient"):
        ran = backend == "naive"  # runs the forward only; the others skip both cases
        records.append(synthetic_record("g", group, backend, [1.0, 1.1], status="ok" if ran else "unsupported"))
        records.append(synthetic_record("g", group.replace(pass_="fwd_bwd"), backend, [1.0, 1.1],
                                        status="unsupported"))
    (note,) = grouped_note(records)
    assert "which 3 of 4 backends skip" in note  # naive ran one of them: it does not skip them


def test_help_keeps_the_brackets_of_a_trace_line():
    res = cli("run", "--help")
    assert res.returncode == 0
    assert '{"requests": [[new, keys], ...]}' in " ".join(res.stdout.replace("│", " ").split())


def test_compare_and_merge_name_their_arguments_as_usage_lines_do():
    usage = cli("compare", "--help").stdout.splitlines()[1].split()
    assert usage[-2:] == ["RUN_A", "RUN_B"]  # not {run_a} {run_b}
    assert cli("merge", "--help").stdout.splitlines()[1].split()[-2:] == ["OUTPUT", "INPUT..."]


def test_a_single_sequence_length_is_named_as_labels_name_it():
    from attnbench.report import summary
    spec = AttnSpec(seqlens_q=(128,), heads_q=4, head_dim=64, dtype="fp32", pass_="fwd")
    records = [synthetic_record("h", spec.replace(causal=c), b, [1.0]) for c in (False, True)
               for b in ("naive", "sdpa-math")]
    assert summary.build(records).header.startswith("b1 s128 h4 d64 fp32 fwd · ")
    grouped = [synthetic_record("h", spec.replace(seqlens_q=(64, 96), seqlens_k=(64, 96), causal=c), "naive", [1.0])
               for c in (False, True)]
    assert summary.build(grouped).header.startswith("b1 s64,96 h4 ")


def test_presets_name_each_model_once():
    import re

    from attnbench import presets

    def key(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())
    lines = cli("presets").stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(presets.PRESETS)
    for name, line in zip(presets.PRESETS, lines, strict=True):
        assert key(line).count(key(name)) == 1, line  # "gpt-oss-20b  gpt-oss-20b: ..." named it twice
    assert re.match(r"deepseek-v3 +MLA decode: 128/1 heads", lines[list(presets.PRESETS).index("deepseek-v3")])


def test_other_processes_never_use_more_cores_than_there_are():
    from attnbench.report.footnotes import cpu_notes
    spec = AttnSpec(seqlens_q=(64,), heads_q=2, head_dim=16, dtype="fp32", pass_="fwd")

    def note(others: float) -> str:
        record = synthetic_record("c", spec, "naive", [1.0], info={"cpu": {"threads": 1, "cores": 2,
                                                                           "others_at_start": others}})
        return cpu_notes([record])[0]
    assert note(2.2) == "CPU: 1 thread of 2 cores (other processes were using all 2 cores when the run started)"
    assert note(1.97).endswith("using all 2 cores when the run started)")
    assert note(1.2).endswith("using 1.2 cores when the run started)")


def test_the_reports_environment_has_no_empty_header_row():
    from attnbench.report import html_tables
    text = html_tables.environment({"device_name": "AMD EPYC", "torch": "2.13.0", "python": "3.11.7"})
    assert "<th></th>" not in text and "<thead>" not in text
    assert "<td>device</td><td>AMD EPYC</td>" in text and "<td>software</td><td>torch 2.13.0, python 3.11.7</td>" in text


def test_backends_says_how_to_have_flex_on_the_cpu(tmp_path):
    import inspect
    import json

    from attnbench.backends import registry
    rows = {r["name"]: r for r in json.loads(cli("backends", "--device", "cpu", "--json").stdout)}
    assert "--backend-opt flex.cpu=true" in rows["flex"]["reason"] and "not cpu" not in rows["flex"]["reason"]
    import torch
    # no option offers it here; without a GPU at all the reason says that first
    assert rows["sdpa-cudnn"]["reason"] == ("runs on cuda, not cpu" if torch.cuda.is_available()
                                            else "no GPU here (runs on cuda)")
    for name in registry.names():  # the option each hint names is one the backend takes
        backend = registry.get(name)
        for device in getattr(backend, "device_options", {}):
            assert inspect.signature(type(backend)).parameters[device].annotation in (bool, "bool"), name
            assert device in type(backend)(**{device: True}).capabilities.devices
    res = cli("run", "--device", "cpu", "--backends", "flex", "--db", tmp_path / "r.db")
    assert res.returncode == 2 and "--backend-opt flex.cpu=true" in res.stderr and not (tmp_path / "r.db").exists()


def test_torchs_no_cuda_runtime_warning_stays_out_of_a_cpu_runs_output():
    import logging

    import attnbench.backends.base  # noqa: F401  (installs the filter, as every process running kernels does)

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def emit(self, record):
            self.seen.append(record.getMessage())
    logger, keep = logging.getLogger("torch.utils.cpp_extension"), Keep()
    logger.addHandler(keep)
    try:  # as torch.utils.cpp_extension logs it on import, where torch was built for CUDA and no GPU is there
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        logger.warning("Error checking compiler version for %s", "c++")  # its other warnings still show
    finally:
        logger.removeHandler(keep)
    assert keep.seen == ["Error checking compiler version for c++"]

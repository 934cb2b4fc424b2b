"""Every `attnbench ...` command of README.md and docs/guide.md, run as a user would copy it.

The commands are read from the documents' code blocks (lines starting with ``attnbench ``, a line ending in a
backslash joined to the next, a ``for`` loop kept whole) and each one is classified below: run on the CPU as
written, refused on the CPU on purpose (exit 2 and the line that says so; a GPU's work says it is a GPU-sized
command and what it would cost here), checked on the CPU up to its plan (every option validated, the trace read,
nothing run: minutes of work), run on a GPU only, or not run at all, with why. What the CPU commands print is
laid out for 100 columns ($COLUMNS=100, as a pipe or CI log), and no line may be wider. A command added to the documents fails ``test_every_command_is_classified`` until it is classified.
The CPU commands run in document order in one folder, README first, as one user following both would; the
placeholders (``ID``, ``RUN_A``, ``A``...) name runs made before them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from results_fixtures import SRC, cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/guide.md")

CPU = "cpu"
"""Runs on the CPU as written (exit status 0)."""
CPU_VERDICT = "cpu-verdict"
"""Runs on the CPU as written; exit status 0, or 1 when it finds what it looks for (a regression)."""
CPU_REFUSED = "cpu-refused"
"""Runs on the CPU as written and is refused there on purpose: exit 2 with the given words."""
GPU_SIZED = "gpu-sized"
"""A GPU's work (hours on a 2-core CPU, or more memory than it has): refused on the CPU before it starts, in one
line that says it is a GPU-sized command and what it would cost there (exit 2); the GPU test runs it."""
PLAN = "plan"
"""GPU-sized work (minutes or tens of GB on a 2-core CPU): the CPU test builds its plan (options, trace, cases
validated; nothing run); the GPU test runs it."""
GPU = "gpu"
"""Names a GPU-only backend, timing mode or profiler: run by the GPU test."""
SKIP = "skip"
"""Not run by either test, for the reason given."""

SLOW_ON_CPU = "minutes on a 2-core CPU (2026-11-28: 2 min, every case a few hundred ms at 8k keys)"

# (the command's start, whitespace squeezed) -> (kind, why or what the CPU refusal says)
CLASSES: dict[str, tuple[str, str]] = {
    # README.md
    "attnbench backends": (CPU, ""),
    "attnbench run --backends fa3,sdpa-cudnn": (GPU, "FlashAttention-3 and cuDNN run on NVIDIA GPUs only"),
    "attnbench run --preset gpt-oss-120b --seq-lens 8k..128k:x2": (GPU_SIZED, "8k-128k tokens, 64 heads"),
    "attnbench run --preset qwen3-next-80b --seq-lens 4k 16k": (GPU_SIZED, "4k-16k tokens, 16 heads of 256"),
    "attnbench run --sinks both --softcap none 50 --causal": (CPU, ""),
    "attnbench run --batch 2q2k_128q1kv2k --page-size 1 16": (
        CPU_REFUSED, "--page-size none runs them on naive"),  # no CPU kernel reads a paged cache
    "attnbench run --batch-trace examples/serving-trace.jsonl --shared-prefix 1k --kv-dtype same fp8": (
        GPU_SIZED, "40 steps of ~200 requests: on a CPU over 20 GB of keys written out per step"),
    "attnbench run --preset deepseek-v3 --batch 128q1kv1k..32k": (GPU_SIZED, "128 decodes over up to 32k keys, 128 heads"),
    "attnbench run --preset deepseek-v3.2-sparse-prefill": (GPU_SIZED, "4096 queries, 128 heads, top-k 2048"),
    "attnbench run --preset qwen3.5-gdn --seq-lens 4k 32k": (GPU_SIZED, "32k tokens of 64 value heads"),
    "attnbench run --op sparse-mla": (CPU, ""),
    "attnbench run --op gdn": (CPU, ""),
    "attnbench e2e --model qwen3-next-tiny --device cpu": (CPU, ""),
    "attnbench run --baseline sdpa-flash": (CPU, ""),
    "attnbench verify": (CPU, ""),
    "attnbench runs; attnbench show --run ID": (CPU, ""),
    "attnbench report": (CPU, ""),
    "attnbench compare RUN_A RUN_B": (CPU, ""),
    "attnbench dist --nproc 2 --method zigzag,ulysses --kernel fa3": (
        SKIP, "two GPUs with FlashAttention-3; the methods are tested in tests/gpu/test_dist_kernels.py"),
    "attnbench e2e --model cogvideox-2b --backends sdpa-flash,fa2,sage": (GPU, "CogVideoX-2b with fa2 and sage"),
    # docs/guide.md
    "attnbench env": (CPU, ""),
    "attnbench run --seq-lens 512..16k:x2 --backends sdpa-flash,sdpa-cudnn": (GPU, "cuDNN runs on NVIDIA GPUs only"),
    "attnbench run --seq-lens 128,128,128": (CPU, ""),
    "attnbench run --seq-lens 1 16 --kv-seq-lens 8k": (PLAN, SLOW_ON_CPU),
    "attnbench run --config sweep.yaml --dtype fp16": (SKIP, "sweep.yaml is the reader's own file (YAML configs: "
                                                       "tests/unit/test_cli.py)"),
    "attnbench run --timing graph --seq-lens 512 1k": (GPU, "CUDA graphs"),
    "attnbench run --profiler torch": (GPU, "the torch profiler's kernel times are a GPU's"),
    "attnbench run --profiler ncu --repeat 5": (SKIP, "needs Nsight Compute and GPU counters "
                                                      "(tests/unit/test_profilers.py; tests/gpu/test_timing_gpu.py)"),
    "attnbench run --profiler nsys": (SKIP, "needs Nsight Systems (tests/unit/test_nsys_ranges.py)"),
    "attnbench run --trace traces/": (CPU, ""),
    "attnbench calibrate": (CPU, ""),
    "attnbench e2e --model llama-tiny --device cpu --backends naive,sdpa-math --dtype fp32": (CPU, ""),
    "attnbench e2e --model cogvideox-2b --backends sdpa-flash,sdpa-cudnn,flex,fa4,sage": (
        GPU, "CogVideoX-2b with FA4 and sage"),
    "attnbench e2e --model llama3-8b --layers 8 --mode train --seq-len 4096 --backends sdpa-flash,sdpa-cudnn": (
        GPU, "an 8-layer Llama-3-8B training step"),
    "attnbench e2e --model llama3-8b --layers 8 --mode train --sinks": (GPU, "FA4 and an 8-layer Llama-3-8B"),
    "attnbench e2e --model llama-tiny --device cpu --softcap 30": (CPU, ""),
    "attnbench e2e --model qwen3-next-tiny --device cpu --backends naive,sdpa-math --dtype fp32": (CPU, ""),
    "attnbench e2e --model qwen3-next --layers 8 --seq-len 16384 --gate --recurrence fla-chunk": (
        GPU, "fla-core's Triton chunk kernel in an 8-layer Qwen3-Next at 16k tokens"),
    "for s in 0 0.3 0.5 0.7 0.8 0.9 0.95": (GPU, "seven runs at 32k tokens"),
    "attnbench plot --x sparsity --db sweep.db": (GPU, "draws the sparsity sweep above"),
    "attnbench e2e --model cogvideox-2b --backends sdpa-flash,fa3,sta-triton": (GPU, "FA3 and STA's Triton kernel"),
    "attnbench dist --nproc 2 --device cpu": (SKIP, "two processes over gloo: tests/distributed/ runs them"),
    "attnbench verify --seq-lens 4096 --q-heads 16 --head-size 128 --dtype bf16 --causal both": (
        PLAN, "8.5 minutes on a 2-core CPU (2026-11-28): bf16 4096-token backward passes"),
    "attnbench verify --device cpu --seq-lens 77 16,33": (CPU, ""),
    "attnbench verify --op gdn --device cpu": (CPU, ""),
    "attnbench verify --preset deepseek-v3.2-sparse-prefill": (
        PLAN, "4096 queries over 8192 rows, 128 heads, top-k 2048: a GPU's work"),
    "attnbench plot --x seq_len --y ms": (CPU, ""),
    "attnbench plot --run A --run B --x seq_len --y tflops -o cmp.svg": (CPU, ""),
    "attnbench compare RUN_A RUN_B --fail-on-regression 5%": (
        CPU_VERDICT, "two runs on a shared 2-core CPU can differ by more than 5%: exit 1, as documented"),
    "attnbench export --format csv|json|parquet": (SKIP, "a synopsis of the options, not a command "
                                                         "(exports: tests/unit/test_results_views.py)"),
    "attnbench run --backends fa2,sdpa-flash --q-heads 32": (GPU, "flash-attn 2"),
    "attnbench plot --run benchmark-attn-single": (GPU, "draws the flash-attn 2 run above"),
    "attnbench run --backends fa2 --q-heads 32": (GPU, "flash-attn 2"),
    "attnbench plot --run benchmark-attn-grouped": (GPU, "draws the flash-attn 2 run above"),
    "attnbench run --impl Pytorch --backends fa2": (GPU, "flash-attn 2"),
    "attnbench plot --run naive-vs-fa2-": (GPU, "draws the flash-attn 2 runs above"),
    "for s in 0.25 0.5 0.75 0.9": (GPU, "runs at 8k and 16k tokens"),
    "attnbench plot --run sparse-0.25": (GPU, "draws the sparsity runs above"),
    "attnbench merge sweep.db sweep.rank*.db": (SKIP, "merges the files of the torchrun sweep above "
                                                      "(tests/unit/test_shard_merge.py)"),
    "attnbench run --shard 1/4 --run-id nightly-42": (CPU, ""),  # the … stands for the sweep's options
}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    """As a shell reads it: a backslash-continued line joined, a ``for`` loop whole, the comment dropped."""

    @property
    def key(self) -> str:
        matches = [k for k in CLASSES if re.match(re.escape(k) + (r"" if k.endswith("-") else r"(?![\w.,])"),
                                                  self.text)]
        return max(matches, key=len) if matches else ""

    @property
    def kind(self) -> str:
        return CLASSES[self.key][0]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _uncomment(line: str) -> str:
    """The line without its shell comment (`` # ...``; no command of the documents has a # of its own)."""
    return re.sub(r"(^|\s+)#.*$", "", line).strip()


def doc_commands() -> list[Command]:
    """The commands of the documents' code blocks: ```bash blocks, and unlabelled ones that hold commands (not a
    sample of what a command prints)."""
    out: list[Command] = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        fence, block = None, []
        for n, line in enumerate(lines, 1):
            if line.strip().startswith("```"):
                if fence is None:
                    fence, block = line.strip()[3:], []
                    continue
                first = next((text for _, text in block if text.strip()), "")
                if fence == "bash" or (fence == "" and re.match(r"\s*(attnbench|for|torchrun) ", first)):
                    out += _block_commands(doc, block)
                fence = None
            elif fence is not None:
                block.append((n, line))
    return out


def _block_commands(doc: str, block: list[tuple[int, str]]) -> list[Command]:
    out, i = [], 0
    while i < len(block):
        n, line = block[i]
        text = line.strip()
        if text.startswith("for ") and "attnbench " in "".join(t for _, t in block[i:]):
            loop = ""
            while i < len(block):
                part = _uncomment(block[i][1])
                loop += part.rstrip("\\").strip() + (" " if part.endswith("\\") else "\n")
                if part == "done":
                    break
                i += 1
            out.append(Command(doc, n, loop.strip()))
        elif text.startswith("attnbench "):
            parts = [text]
            while parts[-1].endswith("\\") and i + 1 < len(block):
                i += 1
                parts.append(block[i][1].strip())
            out.append(Command(doc, n, " ".join(_uncomment(p).rstrip("\\").strip() for p in parts).strip()))
        i += 1
    return out


COMMANDS = doc_commands()


def test_every_command_is_classified():
    assert len(COMMANDS) > 50 and sum(c.kind in (GPU, GPU_SIZED, PLAN) for c in COMMANDS) >= 20  # both documents read
    unclassified = [str(c) for c in COMMANDS if not c.key]
    assert not unclassified, "classify these in CLASSES: " + "; ".join(unclassified)
    unused = [k for k in CLASSES if not any(c.key == k for c in COMMANDS)]
    assert not unused, f"no document holds these any more: {unused}"
    assert all(why for c in COMMANDS if c.kind != CPU for why in [CLASSES[c.key][1]]), "say why"


# ---- the CPU ------------------------------------------------------------------------------------------------
def _runs(folder: Path) -> list[tuple[str, str]]:
    """(run id, command) of the store in ``folder``, oldest first."""
    with sqlite3.connect(folder / "attnbench-results" / "attnbench.db") as conn:
        return conn.execute("SELECT run_id, command FROM runs ORDER BY created_at").fetchall()


def _pair(folder: Path) -> tuple[str, str]:
    """The newest two runs of `attnbench run` that have cases in common (what `compare` and an overlaid plot
    need), older first."""
    with sqlite3.connect(folder / "attnbench-results" / "attnbench.db") as conn:
        runs = [r for r, c in conn.execute("SELECT run_id, command FROM runs ORDER BY created_at")
                if c.startswith("attnbench run ")]
        cases = {r: {c for (c,) in conn.execute("SELECT case_id FROM records WHERE run_id = ?", (r,))} for r in runs}
    for j in range(len(runs) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            if cases[runs[i]] & cases[runs[j]]:
                return runs[i], runs[j]
    raise AssertionError(f"no two runs share a case: {runs}")


def _argv(words: list[str], folder: Path) -> list[str]:
    """The placeholders filled in: ID the newest run, RUN_A/A and RUN_B/B a pair of runs to compare; the … of
    a synopsis (the sweep's other options) dropped."""
    if {"RUN_A", "A"} & set(words):
        a, b = _pair(folder)
        words = [a if w in ("RUN_A", "A") else b if w in ("RUN_B", "B") else w for w in words]
    if "ID" in words:
        words = [_runs(folder)[-1][0] if w == "ID" else w for w in words]
    return [w for w in words if w != "…"]


def _plan_only(monkeypatch) -> list:
    """Make `run` and `verify` stop once their plan is built (every option checked, the sweep expanded)."""
    from attnbench.cli import run as run_cmd
    from attnbench.cli import verify as verify_cmd
    plans = []

    def stop(plan, **kwargs):
        plans.append(plan)
        raise SystemExit(0)
    monkeypatch.setattr(run_cmd, "execute", stop)
    monkeypatch.setattr(verify_cmd, "execute_checks", stop)
    return plans


def _only_the_shipped_backends(monkeypatch) -> None:
    """The backends a user has: none of the test suite's own (other test modules register a backend that crashes
    on purpose, which a documented `attnbench run` of every backend would then run in this process)."""
    from attnbench.backends import registry
    monkeypatch.setattr(registry, "_extra", {})
    monkeypatch.delenv("ATTNBENCH_PLUGINS", raising=False)


WIDTH = 100
"""Columns of a pipe or a CI log ($COLUMNS, ``cli.common.pipe_width``): no line a CPU command prints is wider."""
COMPARE_VERDICT = r"attnbench: \d+ regression\(s\) beyond "
KNOWN_WIDE = {
    r"attnbench: error: nothing to run: ": "a refusal that counts each reason and the backends it holds for",
    COMPARE_VERDICT: "compare's verdict with the worst case and its interval",
}
"""Lines wider than ``WIDTH`` still printed (a pattern of their start -> what they are), each to be shortened where
it is made. An entry no command prints any more fails the test, so that it goes once its line fits (compare's
verdict is printed only when the two runs differ: it may not be)."""


def _too_wide(command: Command, out: str, seen: set[str]) -> list[str]:
    wide = []
    for line in out.splitlines():
        if len(line) <= WIDTH:
            continue
        known = next((k for k in KNOWN_WIDE if re.match(k, line)), None)
        if known is None:
            wide.append(f"{command}: a line of {len(line)} columns: {line[:160]}")
        seen.add(known or "")
    return wide


def _as_in_a_pipe(monkeypatch) -> None:
    """Consoles laid out as for a pipe at $COLUMNS=100, whatever the terminal running the tests."""
    from attnbench.cli import common
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setattr(common, "console", common._console())
    monkeypatch.setattr(common, "err_console", common._console(stderr=True))


def _a_2_core_cpu(monkeypatch) -> list:
    """The estimate at a 2-core CPU's rates and 22 GiB free (what the refusals above were measured on), on any
    machine; a run that starts anyway is recorded, not run for hours."""
    from attnbench import memory
    from attnbench.cli import run as run_cmd
    from attnbench.timing import estimate
    monkeypatch.setattr(estimate, "probe", lambda dtypes: estimate.Rates(
        flops={"fp32": 50e9, "bf16": 100e9, "fp16": 5e9}, fresh_bytes=2e9, threads=1))
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 22 << 30)
    started, make_runner = [], run_cmd.control.make_runner

    def made(plan, **kwargs):
        runner = make_runner(plan, **kwargs)
        runner.run = lambda specs: started.append(plan) or []
        return runner
    monkeypatch.setattr(run_cmd.control, "make_runner", made)
    return started


@pytest.mark.slow
def test_the_cpu_commands_run_as_written(tmp_path, monkeypatch):
    """README first, then the guide, in one folder: each CPU command exits 0 (a refused one 2, with the line
    that says why; a GPU-sized one 2, saying so before it starts), and each minutes-long one is a valid plan on
    the CPU. No line of what they print is wider than 100 columns."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine, on any machine
    _only_the_shipped_backends(monkeypatch)
    _as_in_a_pipe(monkeypatch)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the trace, as from the checkout
    failures, wide_seen = [], set()
    for command in COMMANDS:
        kind, expected = CLASSES[command.key]
        if kind not in (CPU, CPU_VERDICT, CPU_REFUSED, GPU_SIZED, PLAN):
            continue
        for part in command.text.split("; "):  # `attnbench runs; attnbench show --run ID`
            argv = _argv(shlex.split(part)[1:], tmp_path)
            if kind == PLAN:
                with monkeypatch.context() as m:
                    plans = _plan_only(m)
                    res = cli(*argv, "--device", "cpu")
                if res.returncode != 0 or len(plans) != 1 or not plans[0].specs:
                    failures.append(f"{command}: no plan: exit {res.returncode}: {res.stderr.strip()[-300:]}")
                continue
            if kind == GPU_SIZED:
                with monkeypatch.context() as m:
                    started = _a_2_core_cpu(m)
                    res = cli(*argv)
                lines = res.stderr.strip().splitlines()
                if res.returncode != 2 or started or len(lines) != 1 or \
                        not lines[0].startswith("attnbench: error: a GPU-sized command: "):
                    failures.append(f"{command}: not refused as a GPU's work: exit {res.returncode}, "
                                    f"{'started' if started else 'not started'}: {res.stderr.strip()[-300:]}")
                failures += _too_wide(command, res.stdout + res.stderr, wide_seen)
                continue
            res = cli(*argv)
            failures += _too_wide(command, res.stdout + res.stderr, wide_seen)
            want = 2 if kind == CPU_REFUSED else 0
            if kind == CPU_VERDICT and res.returncode == 1:
                continue
            if kind == CPU_VERDICT:
                expected = ""
            if res.returncode != want or (expected and expected not in res.stderr):
                failures.append(f"{command}: exit {res.returncode} (expected {want}{f', {expected!r}' * bool(expected)}"
                                f"): {res.stderr.strip()[-400:]}")
            elif kind == CPU_REFUSED and len(res.stderr.strip().splitlines()) != 1:
                failures.append(f"{command}: the refusal is not one line: {res.stderr}")
    gone = set(KNOWN_WIDE) - wide_seen - {COMPARE_VERDICT}
    assert not failures, "\n".join(failures)
    assert not gone, f"no command prints these wide lines any more; drop them from KNOWN_WIDE: {sorted(gone)}"
    assert (tmp_path / "traces").is_dir() and any((tmp_path / "traces").iterdir())  # run --trace traces/
    assert (tmp_path / "cmp.svg").is_file() and (tmp_path / "sweep-1.db").is_file()  # plot -o; shard 1 of 4 (0-based)
    kinds = [c.split()[1] for _, c in _runs(tmp_path)]
    assert kinds.count("run") == 6 and kinds.count("verify") == 3 and kinds.count("e2e") == 4


def test_the_shipped_trace_takes_the_readmes_shared_prefix():
    """The README replays examples/serving-trace.jsonl with --shared-prefix 1k: every request of every step must
    hold at least 1024 cached keys (it had pure prefills, so any shared prefix failed: exit 2)."""
    from attnbench.serving import read_trace
    command = next(c for c in COMMANDS if "--batch-trace examples/serving-trace.jsonl" in c.text)
    assert "--shared-prefix 1k" in command.text
    for batch in read_trace(ROOT / "examples" / "serving-trace.jsonl"):
        assert min(k - q for q, k in batch.requests) >= 1024, batch.name


def test_the_readme_says_how_a_cpu_machine_installs_and_what_it_costs():
    """Beside the two set-up commands (kept as they are): the CPU wheel of torch first (pip fetches the CUDA
    build otherwise), and the two commands' cost on a 2-core CPU, dated and with the command measured."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Two commands"):text.index("On a GPU the default sweep")]
    assert "pip install -e . && attnbench run " in section and 'pip install -e ".[test]" && pytest ' in section
    cpu = section.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert cpu < section.index("then the two commands")
    assert "2-core" in section and "2026-11-28" in section and "`python3 -m attnbench run`" in section
    assert re.search(r"`attnbench run`.*?\d+(\.\d)? s wall \(median of 3", section, re.S)
    assert re.search(r"`pytest`, \d+(\.\d)?\s+minutes \(\S+ passed", section, re.S)


# ---- a GPU -----------------------------------------------------------------------------------------------
def _named_backends(text: str) -> list[str]:
    names = []
    for flag in ("--backends", "--kernel", "--impl"):
        for m in re.finditer(rf"{flag}[ =](\S+)", text):
            names += [{"Pytorch": "naive", "Flash2": "fa2"}.get(n, n) for n in m[1].split(",")]
    return names


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_the_gpu_commands_run_as_written(doc, tmp_path):
    """Each document's GPU and GPU-sized commands, in order, in one folder, under bash (loops and $(...) as
    written); a command naming a backend that is not installed here is left out, said so in the skip."""
    from attnbench.cli.run import cannot_run
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    shell = f"attnbench() {{ {shlex.quote(sys.executable)} -m attnbench \"$@\"; }}\n"
    left_out, failures, runs_left_out = [], [], []
    for command in COMMANDS:
        if command.doc != doc or command.kind not in (GPU, GPU_SIZED, PLAN):
            continue
        missing = [n for n in _named_backends(command.text) if cannot_run(n, "cuda")]
        if re.search(r"--model (cogvideox|wan)", command.text) and importlib.util.find_spec("diffusers") is None:
            missing.append("diffusers")
        if any(f"--run {r}" in command.text for r in runs_left_out):  # draws a run left out above
            missing.append("its run")
        if missing:
            left_out.append(f"{command} ({', '.join(missing)} not here)")
            runs_left_out += [r.split("$")[0] for r in re.findall(r"--run-id (\S+)", command.text)]
            continue
        res = subprocess.run(["bash", "-c", shell + command.text], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=1800)
        if res.returncode != 0:
            failures.append(f"{command}: exit {res.returncode}: {res.stderr.strip()[-400:]}")
    assert not failures, "\n".join(failures)
    if left_out:
        pytest.skip("ran the others; left out: " + "; ".join(left_out))

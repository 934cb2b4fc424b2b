"""Commands that only parse, print help or read the results store answer without importing torch (a second of
start-up): --help, --version, an argument error, presets, runs and show. Each runs in a fresh interpreter
through the console entry point, which reports at exit whether torch was imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

SRC = str(Path(__file__).resolve().parents[2] / "src")
MARK = "torch imported at exit:"
ENTRY = (
    "import atexit, sys\n"
    f"atexit.register(lambda: sys.stderr.write('\\n{MARK} ' + str('torch' in sys.modules) + '\\n'))\n"
    "sys.argv = ['attnbench', *sys.argv[1:]]\n"
    "from attnbench.entry import main\n"
    "main()\n"
)


def start(*args) -> tuple[int, str, str, bool]:
    """(exit status, stdout, stderr without the report, whether torch was imported) of ``attnbench ARGS``."""
    env = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_PLUGINS"}  # a plug-in may import torch itself
    env.update(PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="100")
    res = subprocess.run([sys.executable, "-c", ENTRY, *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=120)
    err, _, report = res.stderr.rpartition(MARK)
    assert report.strip() in ("True", "False"), res.stderr
    return res.returncode, res.stdout, err.rstrip("\n"), report.strip() == "True"


@pytest.fixture
def store(tmp_path) -> Path:
    """A results file with one finished run of two backends."""
    path = tmp_path / "results.db"
    with ResultStore(path) as db:
        db.start_run("startup-run", command="attnbench run --device cpu", config={}, env_id=None, version="test")
        for seq in (64, 128):
            for backend in ("naive", "sdpa-math"):
                spec = AttnSpec(seqlens_q=(seq,), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd")
                db.write(Record(run_id="startup-run", backend=backend, spec=spec, timing_mode="events", device="cpu",
                                samples_ms=[1.0, 1.1, 0.9], median_ms=1.0, n=3, tflops=0.1, gbps=1.0))
        db.finish_run("startup-run")
    return path


@pytest.mark.parametrize("args, code, shows", [
    (["--help"], 0, "Benchmark, verify and compare attention kernels"),
    (["run", "--help"], 0, "--seq-lens"),
    (["--version"], 0, "attnbench 0.1.0 (torch "),
    (["run", "--bogus"], 2, "No such option: --bogus"),
    (["presets"], 0, "gemma2-9b"),
])
def test_help_version_argument_errors_and_presets_do_not_import_torch(args, code, shows):
    status, out, err, torch_imported = start(*args)
    assert status == code and shows in out + err, (out, err)
    assert not torch_imported


def test_the_version_names_the_installed_torch():
    import torch

    status, out, _, torch_imported = start("--version")
    assert status == 0 and out.strip().endswith(f"(torch {torch.__version__})") and not torch_imported


@pytest.mark.parametrize("args, shows", [
    (["runs"], "startup-run"),
    (["show"], "sdpa"),
    (["show", "--table"], "sdpa-math"),
])
def test_the_store_views_do_not_import_torch(store, args, shows):
    status, out, err, torch_imported = start(*args, "--db", store)
    assert status == 0 and shows in out, (out, err)
    assert not torch_imported


def test_a_command_that_measures_still_imports_torch():
    """The report itself is checked: a command that needs the device says torch was imported."""
    status, out, err, torch_imported = start("env", "--device", "cpu", "--json")
    assert status == 0 and '"torch"' in out, (out, err)
    assert torch_imported

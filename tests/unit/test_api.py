"""The Python API: the example that opens docs/api.md runs as written, and the API takes the command line's
options and refuses bad ones with the same one-line message."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_docs_example_runs(tmp_path, monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    code = code.replace("/tmp/attnbench-api-example.db", str(tmp_path / "api.db"))
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "4 cases: b1 s64 h4 d32 fp32 gate" in out and "checks pass" in out


def test_plan_validates_like_the_command_line():
    import attnbench
    plan = attnbench.plan(device="cpu", seq_lens="128", causal=True, backends="naive", softcap=[30, "none"])
    assert [s.softcap for s in plan.specs] == [30.0, 30.0, None, None]  # each softcap, fwd and fwd_bwd
    with pytest.raises(ValueError, match="bad --softcap"):
        attnbench.plan(device="cpu", seq_lens="128", softcap=-1)


def test_importing_the_package_imports_no_torch():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import attnbench, sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True, cwd=DOC.parents[1] / "src").stdout
    assert out.strip() == "False"


def test_backend_options_reach_the_run_and_leave_the_registry_alone(tmp_path):
    import attnbench
    from attnbench.backends import registry
    before = registry.registered("flex-sparse")
    plan = attnbench.plan(device="cpu", seq_lens="64", q_heads=2, head_size=16, dtype="fp32", pass_="fwd",
                          causal=False, backends="flex-sparse", backend_opt=["flex-sparse.sparsity=0.5"],
                          db=str(tmp_path / "o.db"))
    assert plan.options.backend_options == {"flex-sparse": {"sparsity": 0.5}}
    assert registry.registered("flex-sparse") is before  # the run's options are its own
    for isolate in (False, True):  # in this process and in a worker process
        records = attnbench.run(plan if not isolate else plan.__class__(**{**plan.__dict__, "isolate": True}))
        assert records[0].status == "ok", records[0].reason
        assert records[0].info["target_sparsity"] == 0.5, records[0].info  # the option, not the default

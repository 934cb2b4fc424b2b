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

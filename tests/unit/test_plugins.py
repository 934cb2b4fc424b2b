"""Third-party backends through the ``attnbench.backends`` entry point group: the example in
docs/plugins.md, installed as a distribution in a temporary directory, runs through the Runner."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from attnbench.backends import registry
from attnbench.inputs import make_inputs
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def doc_block(lang: str, after: str) -> str:
    """The first ```lang block that follows the line ``after`` in docs/plugins.md."""
    text = DOC.read_text()
    start = text.index(after)
    match = re.search(rf"```{lang}\n(.*?)```", text[start:], re.S)
    return match.group(1)


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """docs/plugins.md's pyproject entry point and module, laid out as an installed distribution."""
    (tmp_path / "mykernel_attnbench.py").write_text(doc_block("python", "`mykernel_attnbench.py`"))
    pyproject = doc_block("toml", "`pyproject.toml`")
    group, entries = re.search(r'\[project\.entry-points\."([^"]+)"\]\n(.*)', pyproject, re.S).groups()
    dist = tmp_path / "attnbench_mykernel-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: attnbench-mykernel\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entries.strip()}\n".replace('"', ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield "mykernel"
    sys.modules.pop("mykernel_attnbench", None)


def test_docs_example_uses_the_registry_group():
    assert registry.ENTRY_POINT_GROUP in doc_block("toml", "`pyproject.toml`")


def test_entry_point_backend_is_listed_and_loaded(installed_plugin):
    assert installed_plugin in registry.names()
    assert installed_plugin in registry.available("cpu")
    backend = registry.get(installed_plugin)
    assert type(backend).__module__ == "mykernel_attnbench"
    assert "GQA" in backend.supports(AttnSpec(seqlens_q=(17,), heads_q=4, heads_kv=2), "cpu")


def test_entry_point_backend_runs_through_the_runner(installed_plugin):
    specs = [AttnSpec(batch=2, seqlens_q=(17,), heads_q=3, head_dim=8, dtype="fp64", causal=c, pass_=p)
             for c in (False, True) for p in ("fwd", "fwd_bwd")]
    records = []
    runner = Runner(RunOptions(device="cpu", backends=(installed_plugin,), timing=TimingConfig(warmup=0, repeat=2)),
                    run_id="plugin", env_id=None, sink=records.append)
    runner.run(specs)
    assert [r.status for r in records] == ["ok"] * 4
    assert all(r.backend == "mykernel" and r.info["kernel"] == "F.scaled_dot_product_attention" for r in records)
    assert all(r.median_ms > 0 and r.tflops > 0 for r in records)
    spec = specs[3]
    inputs = make_inputs(spec, "cpu", seed=0)
    got = registry.get(installed_plugin).prepare(spec, inputs).fn()
    ref = registry.get("naive").prepare(spec, inputs).fn()
    torch.testing.assert_close(got.dq, ref.dq)


def test_broken_plugin_does_not_break_the_listing(tmp_path, monkeypatch):
    dist = tmp_path / "broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attnbench.backends]\nbroken = no_such_module_xyz:Backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert "broken" in registry.names()
    assert "broken" not in registry.available("cpu")
    with pytest.raises(ModuleNotFoundError):
        registry.get("broken")

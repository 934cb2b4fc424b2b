"""What a user reads on a machine without a GPU: a run that ran nothing fails, inference features take the forward
pass without being told, a GPU-only backend says there is no GPU first, and an interrupted run says how far it got."""

from __future__ import annotations

import pytest
from results_fixtures import attnbench

from attnbench import cli
from attnbench.cli import run as run_cmd


class Accepted(BaseException):
    """Raised instead of running a plan: the input was accepted."""


@pytest.fixture
def plans(monkeypatch):
    seen = []

    def keep(plan, **kwargs):
        seen.append(plan)
        raise Accepted
    monkeypatch.setattr(run_cmd, "execute", keep)
    return seen


def test_a_run_that_ran_nothing_fails_with_skip_missing_too_naming_who_would_take_it(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("run", "--device", "cpu", "--batch", "2q64_4q1kv128", "--page-size", "16", "--backends", "naive",
                    "--skip-missing", "--pass", "fwd", "--quiet", "--db", db)
    assert res.returncode == 2, res.stderr
    line, = res.stderr.strip().splitlines()
    assert "none of the 1 cases ran here" in line and "no paged KV cache" in line
    assert "flashinfer-paged (cuda)" in line or "fa3-paged (cuda)" in line, line  # who would take it
    assert "would take it" in line


@pytest.mark.parametrize("flag", [["--page-size", "16"], ["--kv-dtype", "fp8"], ["--shared-prefix", "16"]])
def test_inference_features_default_to_the_forward_pass(plans, tmp_path, flag):
    with pytest.raises(Accepted):
        cli.main(["run", "--device", "cpu", "--batch", "4q1kv64", *flag, "--skip-missing", "--db", str(tmp_path / "r.db")])
    with pytest.raises(Accepted):  # without a batch too (no CPU kernel reads pages: --skip-missing lets it plan)
        cli.main(["run", "--device", "cpu", "--seq-lens", "64", "--page-size", "16", "--skip-missing",
                  "--db", str(tmp_path / "r.db")])
    assert all(spec.pass_ == "fwd" for plan in plans for spec in plan.specs)


def test_a_backward_asked_for_with_a_page_size_says_what_to_do(capsys, tmp_path):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--device", "cpu", "--seq-lens", "64", "--page-size", "16", "--pass", "fwd_bwd",
                  "--db", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "page size is an inference feature: forward only (not fwd_bwd); give --pass fwd" in err


def test_a_gpu_backend_on_a_machine_without_a_gpu_says_so_first(capsys, monkeypatch, tmp_path):
    import json

    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--device", "cpu", "--backends", "fa3", "--db", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("attnbench: error: backend fa3 runs on cuda: no GPU here"), err
    with pytest.raises(SystemExit) as exc:
        cli.main(["backends", "--device", "cpu"])
    out = capsys.readouterr().out
    assert exc.value.code in (0, None)
    assert "no GPU here:" in out and out.index("no GPU here:") < out.index("install")
    with pytest.raises(SystemExit):
        cli.main(["backends", "--device", "cpu", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["fa3"]["reason"].startswith("no GPU here (runs on cuda); ") and rows["fa3"]["install"]  # for a GPU machine
    assert rows["naive"]["available"]

"""`attnbench dist`'s printout of a case's check: one small table per case, a forward-only case without
gradients, the FA2 write-up's format one flag away."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from attnbench.cli import common
from attnbench.cli import dist as dist_cli
from attnbench.distributed import bench
from attnbench.spec import AttnSpec


def _result(pass_: str, failing: str | None = None) -> bench.CaseResult:
    def tensor(i, name):
        ok = name != failing
        return {"max": 1e-7 * (i + 1), "mean": 1e-8, "err_vs_exact": 1e-7 if ok else 1.0, "bound": 1e-6,
                "pass": ok}
    per_rank = [{n: tensor(i, n) for n in ("out", "dq", "dk", "dv")} for i in range(4)]
    spec = AttnSpec(seqlens_q=(256,), heads_q=4, head_dim=16, dtype="fp32", causal=True, pass_=pass_)
    return bench.CaseResult(spec=spec, method="ring", kernel="sdpa-math", per_rank=per_rank)


@pytest.fixture
def printed(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=out, width=100))
    return out


def test_a_forward_case_shows_no_gradients(printed):
    dist_cli._print_case(_result("fwd"), 4)
    lines = printed.getvalue().strip().splitlines()
    assert len(lines) == 7 and lines[1].split()[-1] == "out"  # heading, table of 4 ranks, verdict
    assert not any(name in printed.getvalue() for name in ("dq", "dk", "dv", "backward"))
    assert max(map(len, lines)) <= 100 and lines[-1].startswith("verdict: pass")


def test_a_forward_and_backward_case_is_one_table(printed):
    dist_cli._print_case(_result("fwd_bwd"), 4)
    lines = printed.getvalue().strip().splitlines()
    assert len(lines) == 7 and lines[1].split()[-4:] == ["out", "dq", "dk", "dv"]
    assert lines[5].split()[:2] == ["rank", "3"] and max(map(len, lines)) <= 100


def test_a_forward_case_whose_gradient_failed_shows_it(printed):
    dist_cli._print_case(_result("fwd", failing="dk"), 4)
    lines = printed.getvalue().strip().splitlines()
    assert lines[1].split()[-2:] == ["out", "dk"] and "verdict: fail" in lines[-1] and " dk, " in lines[-1]


def test_details_prints_the_writeup_format(printed):
    dist_cli._print_case(_result("fwd_bwd"), 4, details=True)
    text = printed.getvalue()
    assert "# backward:" in text and "Rank[3] max " in text and "rank 0 out (distributed) - out_ref" in text
    printed.truncate(0)
    printed.seek(0)
    dist_cli._print_case(_result("fwd"), 4, details=True)
    assert "# forward:" in printed.getvalue() and "backward" not in printed.getvalue()

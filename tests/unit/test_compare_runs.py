"""`attnbench compare`: ratios, bootstrap intervals and the exit codes a CI gate relies on."""

from __future__ import annotations

import numpy as np
import pytest
from results_fixtures import attnbench, cli, synthetic_record

from attnbench.results import compare as cmp
from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec
from attnbench.timing.stats import bootstrap_median_ci

SPECS = [AttnSpec(seqlens_q=(s,), heads_q=8, head_dim=128, dtype="bf16", causal=c, pass_="fwd")
         for s in (577, 2048) for c in (False, True)]
BASE_MS = [1.0, 2.0, 3.0, 4.0]


def _write_run(store: ResultStore, run_id: str, factor: float, seed: int, noise: float = 0.01,
               factors: dict[int, float] | None = None, n: int = 40) -> None:
    """One run of SPECS for backend 'fast': lognormal-ish samples around BASE_MS * factor."""
    rng = np.random.default_rng(seed)
    store.start_run(run_id, command="synthetic", config={}, env_id=None, version="test")
    for i, (spec, base) in enumerate(zip(SPECS, BASE_MS, strict=True)):
        f = (factors or {}).get(i, factor)
        samples = base * f * np.exp(rng.normal(0, noise, n))
        store.write(synthetic_record(run_id, spec, "fast", list(samples)))
    store.finish_run(run_id)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("compare") / "runs.db"
    with ResultStore(path) as store:
        _write_run(store, "base", 1.0, seed=1)
        _write_run(store, "noise", 1.0, seed=2)
        _write_run(store, "slow", 1.0, seed=3, factors={2: 1.25})  # one case 25% slower
        _write_run(store, "slightly", 1.02, seed=4, noise=0.002)  # clearly slower, but by 2% only
        _write_run(store, "fast", 0.8, seed=5)
        # 10% slower in one case, but 6 samples with 30% spread cannot tell that apart from noise: inconclusive
        _write_run(store, "noisy-slow", 1.0, seed=6, noise=0.3, factors={0: 1.1}, n=6)
        spec = AttnSpec(seqlens_q=(4096,), heads_q=8, head_dim=128, dtype="bf16", pass_="fwd")
        store.write(Record(run_id="slow", backend="fast", spec=spec, status="oom", reason="out of memory"))
    return path


def test_bootstrap_interval_holds_the_true_ratio():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.02, 50), rng.normal(1.1, 0.02, 50)
    ratio, low, high = cmp.bootstrap_ratio(a, b, seed=3)
    assert low < ratio < high and low < 1.1 < high and high - low < 0.05
    assert cmp.bootstrap_ratio(a, b, seed=3) == (ratio, low, high)  # seeded: reproducible
    assert cmp.bootstrap_ratio([1.0], [2.0]) == (2.0, None, None)


def test_the_ratio_resamples_each_side_as_the_records_interval_does():
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 0.02, 77)
    ratio, low, high = cmp.bootstrap_ratio(a, a.copy(), seed=5)
    assert ratio == 1.0 and low < 0.995 and high > 1.005  # the same samples twice: still an interval, around 1
    # its spread is that of the two medians' bootstraps the stored intervals come from, combined
    lo_a, hi_a = bootstrap_median_ci(a)
    half = (hi_a - lo_a) / 2 / np.median(a)
    assert 1.0 < (high - low) / 2 / half < 2.0  # about sqrt(2) for two independent sides


def test_thresholds_and_verdicts():
    assert cmp.parse_threshold("5%") == pytest.approx(0.05) and cmp.parse_threshold("12.5") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="percentage"):
        cmp.parse_threshold("five")
    assert cmp.verdict(1.06, 1.2, 0.05) == "regression"
    assert cmp.verdict(1.01, 1.04, 0.05) == "slower"  # slower, within the threshold
    # slower, but by 1% or by 160x: the interval cannot tell, so it is no "slower" (a 162x case was)
    assert cmp.judge(1.01, 162.0, 0.05, samples=40) == ("inconclusive", "slower, but the interval reaches past +5%")
    assert cmp.verdict(0.97, 1.03, 0.05) == "same"
    assert cmp.verdict(0.9, 1.1, 0.05) == "inconclusive"  # holds 1, but a 10% change could hide in it
    assert cmp.verdict(0.7, 0.9, 0.05) == "faster"
    assert cmp.judge(1.06, 269.0, 0.05, samples=5) == ("inconclusive", "5 samples (a verdict needs 10 on each side)")


@pytest.mark.parametrize("run_b, code, verdicts", [
    ("noise", 0, {"same"}),
    ("slow", 1, {"regression", "same"}),
    ("slightly", 0, {"slower"}),
    ("fast", 0, {"faster"}),
    ("noisy-slow", 0, {"inconclusive"}),
])
def test_exit_codes(db, run_b, code, verdicts):
    with ResultStore(db) as store:
        result = cmp.compare(store.rows("base"), store.rows(run_b), threshold=0.05)
    assert {c.verdict for c in result.cases} == verdicts
    res = cli("compare", "base", run_b, "--db", db, "--fail-on-regression", "5%")
    assert res.returncode == code, res.stdout + res.stderr
    assert "B/A" in res.stdout and "95% CI" in res.stdout
    if code:
        assert "regression(s) beyond 5%" in res.stderr and "s2048" in res.stderr


def test_regression_found_only_above_the_threshold(db):
    with ResultStore(db) as store:
        result = cmp.compare(store.rows("base"), store.rows("slow"), threshold=0.05)
    (reg,) = result.regressions
    assert reg.label == "b1 s2048 h8 d128 bf16" and reg.ratio == pytest.approx(1.25, rel=0.02)
    assert result.only_b and result.only_b[0]["status"] == "oom"
    assert cli("compare", "base", "slow", "--db", db, "--fail-on-regression", "30%").returncode == 0
    assert cli("compare", "base", "slow", "--db", db).returncode == 0  # no gate asked for


def test_bad_run_ids_exit_2_in_one_line(db):
    res = attnbench("compare", "base", "nope", "--db", db)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no run 'nope'" in res.stderr and "most recent: " in res.stderr
    assert cli("compare", "base", "slow", "--db", db, "--fail-on-regression", "lots").returncode == 2


def _pair(busy_a: bool, busy_b: bool, factor: float) -> tuple[list[dict], list[dict]]:
    """Rows of one case in runs A and B, B ``factor`` times A's time, either side marked busy (CPU)."""
    rng = np.random.default_rng(0)
    rows = []
    for run_id, f, busy in (("a", 1.0, busy_a), ("b", factor, busy_b)):
        record = synthetic_record(run_id, SPECS[0], "fast", list(f * np.exp(rng.normal(0, 0.01, 40))))
        record.info["cpu"] = {"busy": busy}
        rows.append([record.to_row()])
    return rows[0], rows[1]


@pytest.mark.parametrize("busy_a, busy_b, factor, verdict", [
    (False, True, 1.14, "busy-cpu"),   # other processes move a CPU timing both ways: nothing to call
    (False, True, 0.5, "busy-cpu"),
    (True, False, 2.68, "busy-cpu"),
    (True, False, 0.87, "busy-cpu"),
    (True, True, 1.14, "busy-cpu"),
    (False, False, 1.14, "regression"),
])
def test_a_side_timed_on_a_busy_cpu_is_not_comparable(busy_a, busy_b, factor, verdict):
    rows_a, rows_b = _pair(busy_a, busy_b, factor)
    result = cmp.compare(rows_a, rows_b)
    case, = result.cases
    assert case.verdict == verdict
    if verdict == "busy-cpu":
        assert case.why.startswith("timed on a busy CPU (") and not result.regressions


def test_the_summary_line_counts_busy_cases_apart(tmp_path):
    rows_a, rows_b = _pair(False, True, 1.14)
    db = tmp_path / "busy.db"
    with ResultStore(db) as store:
        for run_id, rows in (("a", rows_a), ("b", rows_b)):
            store.start_run(run_id, command="attnbench run", config={}, env_id=None, version="test")
            for row in rows:
                store.write(Record.from_row(row))
            store.finish_run(run_id)
    res = cli("compare", "a", "b", "--db", db, "--fail-on-regression", "5%")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 cases: 1 busy CPU" in res.stdout and "busy CPU, 1: not comparable" in res.stdout
    assert "regression" not in res.stdout.split("cases:")[1].split("(regression")[0]

"""Statistics of samples (bootstrap CI, outliers) and the sampling policy (repeat + minimum time)."""

import time

import numpy as np
import pytest

from attnbench.timing import TimingConfig
from attnbench.timing.config import MIN_SAMPLES
from attnbench.timing.cpu import time_cpu
from attnbench.timing.stats import (
    bootstrap_median_ci,
    bootstrap_medians,
    describe,
    median_ci_half_width_pct,
    outliers,
)


def test_bootstrap_ci_covers_true_median_at_about_nominal_rate():
    rng = np.random.default_rng(1234)
    true_median = 1.0  # lognormal(mu=0): median exp(0) = 1
    trials, hits = 200, 0
    for t in range(trials):
        x = rng.lognormal(0.0, 0.3, size=41)
        lo, hi = bootstrap_median_ci(x, resamples=600, seed=t)
        hits += lo <= true_median <= hi
    coverage = hits / trials
    assert 0.88 <= coverage <= 0.995, coverage


def test_bootstrap_ci_is_seeded_ordered_and_narrows_with_more_samples():
    rng = np.random.default_rng(0)
    small, large = rng.normal(5, 1, 30), rng.normal(5, 1, 3000)
    assert bootstrap_median_ci(small) == bootstrap_median_ci(small)
    lo_s, hi_s = bootstrap_median_ci(small)
    lo_l, hi_l = bootstrap_median_ci(large)
    assert lo_s <= np.median(small) <= hi_s and lo_l <= np.median(large) <= hi_l
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert bootstrap_median_ci([2.5]) == (2.5, 2.5)
    with pytest.raises(ValueError):
        bootstrap_median_ci([])


@pytest.mark.parametrize("n", [2, 7, 40, 41])
def test_bootstrap_medians_match_brute_force_resampling(n):
    # The order-statistic draw must have the distribution of medians of real resamples.
    rng = np.random.default_rng(n)
    x = np.round(rng.lognormal(0.0, 0.5, size=n), 3)  # rounded: ties included
    fast = bootstrap_medians(x, resamples=40_000, seed=1)
    brute = np.median(x[rng.integers(0, n, size=(40_000, n))], axis=1)
    # Kolmogorov-Smirnov distance of the two (discrete) distributions; two-sample noise at 40k draws ~0.01.
    grid = np.union1d(fast, brute)
    cdf = [np.searchsorted(np.sort(d), grid, side="right") / d.size for d in (fast, brute)]
    assert np.abs(cdf[0] - cdf[1]).max() < 0.015
    # and a wrong order statistic (the upper middle for every n) is told apart by the same test
    wrong = np.sort(x)[np.minimum((n * rng.beta(n // 2 + 1, n - n // 2, size=40_000)).astype(int), n - 1)]
    if n % 2 == 0:
        assert np.abs(np.searchsorted(np.sort(wrong), grid, side="right") / wrong.size - cdf[1]).max() > 0.05


def test_outliers_counted_not_dropped():
    x = [1.0] * 20 + [1.1] * 20 + [5.0, 6.0] + [0.1]
    out = outliers(x)
    assert out["high"] == 2 and out["low"] == 1
    assert out["fences_ms"][0] < 1.0 < 1.1 < out["fences_ms"][1] < 5.0
    info = describe(x)
    assert info["outliers"]["high"] == 2 and info["measured_ms"] == pytest.approx(sum(x))
    assert info["median_ci95_ms"][0] <= np.median(x) <= info["median_ci95_ms"][1]


def test_sampling_policy_repeat_is_a_minimum_and_time_is_capped():
    cfg = TimingConfig(repeat=10, min_time_ms=100.0, max_repeat=500, ci_target_pct=0)
    assert cfg.samples_wanted([], "cuda") == 10
    assert cfg.samples_wanted([1.0] * 10, "cuda") == 90          # 10 ms measured, 1 ms each
    assert cfg.samples_wanted([20.0] * 10, "cuda") == 0          # 200 ms >= 100 ms
    assert cfg.samples_wanted([0.001] * 10, "cuda") == 490       # capped at max_repeat
    assert cfg.samples_wanted([0.001] * 500, "cuda") == 0
    default = TimingConfig(repeat=3, ci_target_pct=0)
    assert default.min_time_for("cuda") == 100.0 and default.min_time_for("cpu") == 100.0
    assert default.samples_wanted([0.01] * 3, "cpu") > 0   # CPU calls too sample 100 ms, not 3 calls
    assert default.samples_wanted([50.0] * 3, "cpu") == 0


def test_time_cap_stops_slow_kernels_early_but_never_under_min_samples():
    cfg = TimingConfig(repeat=100, min_time_ms=200.0, max_time_ms=1000.0, ci_target_pct=0)
    assert TimingConfig().max_time_for("cuda") == 150.0 and cfg.max_time_for("cpu") == 1000.0
    assert TimingConfig().max_time_for("cpu") == 1000.0
    assert cfg.samples_wanted([], "cuda") == MIN_SAMPLES          # first learn the per-call time
    assert cfg.samples_wanted([150.0] * MIN_SAMPLES, "cuda") == 0  # 1.5 s measured: enough
    assert cfg.samples_wanted([150.0] * 3, "cuda") == MIN_SAMPLES - 3
    assert cfg.samples_wanted([40.0] * 10, "cuda") == 15           # (1000 - 400) / 40
    assert cfg.samples_wanted([1.0] * 10, "cuda") == 90            # fast: repeat is still the minimum
    uncapped = TimingConfig(repeat=100, min_time_ms=200.0, max_time_ms=float("inf"), ci_target_pct=0)
    assert uncapped.samples_wanted([], "cpu") == 100               # no cap when asked for none
    assert uncapped.samples_wanted([150.0] * 10, "cpu") == 90
    # warm-up: about a quarter of the cap after the first call
    assert TimingConfig(warmup=10, max_time_ms=1000.0).warmup_calls(100.0, "cuda") == 2
    assert TimingConfig(warmup=10).warmup_calls(0.05, "cuda") == 9
    assert TimingConfig(warmup=10).warmup_calls(100.0, "cpu") == 2   # a quarter of the 1 s CPU cap
    assert TimingConfig(warmup=0).warmup_calls(1.0, "cuda") == 0
    # a minimum time above the default cap raises the cap with it
    assert TimingConfig(min_time_ms=5000.0).max_time_for("cuda") == 5000.0


def test_time_cap_counts_wall_time_of_host_bound_calls():
    # 30 us kernels that cost 1 ms of wall each (Python launch overhead): the minimum time would ask
    # for thousands of samples; the wall time spent caps them.
    cfg = TimingConfig(repeat=100, min_time_ms=100.0, max_time_ms=500.0, ci_target_pct=0)
    assert cfg.samples_wanted([0.03] * 100, "cuda", elapsed_ms=100.0) == 400   # (500 - 100) / 1 ms each
    assert cfg.samples_wanted([0.03] * 500, "cuda", elapsed_ms=500.0) == 0
    assert cfg.samples_wanted([0.03] * 100, "cuda") > 3000                       # device time alone


def test_sampling_stops_once_the_median_is_known_to_the_target_precision():
    rng = np.random.default_rng(0)
    steady = list(1.0 + 0.001 * rng.standard_normal(30))       # 0.1% spread: CI of the median ~0.04%
    noisy = list(1.0 + 0.05 * rng.standard_normal(30))         # 5% spread: CI ~2%
    cfg = TimingConfig(repeat=30, min_time_ms=100.0, max_time_ms=1000.0)
    assert median_ci_half_width_pct(steady) < 0.1 < median_ci_half_width_pct(noisy)
    assert cfg.precise_enough(steady) and cfg.samples_wanted(steady, "cuda") == 0   # 30 ms measured, stops
    assert not cfg.precise_enough(noisy)
    assert cfg.samples_wanted(noisy, "cuda") == 30             # at most doubles before looking again
    assert cfg.samples_wanted(steady[:20], "cuda") == 10       # repeat stays the minimum
    off = TimingConfig(repeat=30, min_time_ms=100.0, max_time_ms=1000.0, ci_target_pct=0)
    assert not off.precise_enough(steady) and 70 <= off.samples_wanted(steady, "cuda") <= 71
    assert TimingConfig(ci_target_pct=5.0).precise_enough(noisy)


def test_fixed_config_takes_exactly_warmup_and_repeat_calls():
    # ranks of a distributed job: the same number of calls whatever each one measures
    cfg = TimingConfig(warmup=5, repeat=20).fixed()
    assert cfg.warmup_calls(500.0, "cuda") == 4
    assert cfg.samples_wanted([], "cuda") == 20
    assert cfg.samples_wanted([0.001] * 20, "cuda") == 0      # no minimum time
    assert cfg.samples_wanted([900.0] * 12, "cuda") == 8      # no cap


def test_cpu_timer_honours_an_explicit_time_cap():
    calls = []

    def slow():
        calls.append(None)
        time.sleep(0.02)
    samples, _ = time_cpu(slow, TimingConfig(warmup=10, repeat=50, max_time_ms=100.0))
    assert MIN_SAMPLES <= len(samples) < 50
    assert len(calls) - len(samples) < 10                          # the warm-up was cut short too


@pytest.mark.parametrize("kwargs", [dict(mode="fast"), dict(min_time_ms=-1.0), dict(repeat=5, max_repeat=2),
                                    dict(graph_max_copies=0), dict(max_time_ms=0.0),
                                    dict(min_time_ms=10.0, max_time_ms=5.0), dict(ci_target_pct=-0.1),
                                    dict(ci_target_pct=float("nan")), dict(idle_ratio=-1.0)])
def test_bad_timing_config(kwargs):
    with pytest.raises(ValueError):
        TimingConfig(**kwargs)


def test_cpu_timer_keeps_sampling_until_min_time():
    calls = []
    samples, _ = time_cpu(lambda: calls.append(sum(range(2000))),
                       TimingConfig(warmup=1, repeat=3, min_time_ms=5.0, max_repeat=100000, ci_target_pct=0))
    assert len(samples) >= 3 and sum(samples) >= 5.0
    assert len(calls) == len(samples) + 1


def test_the_spin_before_a_chunk_covers_the_host_time_to_queue_it_and_no_more():
    from attnbench.timing.events import HOLD_MARGIN, hold_ms
    # host-bound: 0.2 ms to queue a call that runs 0.05 ms; the device reaches call i at
    # hold + i * 0.05 and the host has queued it by (i + 1) * 0.2
    hold = hold_ms(100, 0.2, 0.05)
    assert all(hold + i * 0.05 >= (i + 1) * 0.2 for i in range(100))
    assert hold == pytest.approx(HOLD_MARGIN * 0.2 * 100 - 0.05 * 99)
    assert hold_ms(10, 0.1, 0.0) == pytest.approx(HOLD_MARGIN * 1.0)   # no device time known yet
    assert hold_ms(10, 0.1, 5.0) == 0.0                                 # device-bound: no spin needed


def _retime_with(monkeypatch, *draws, ci_target_pct=0.3):
    """_measure_settled on a (pretend) GPU whose measurements return ``draws`` in turn."""
    import torch

    from attnbench.timing import Measurement
    from attnbench.timing import case as case_mod
    calls = iter(draws)
    monkeypatch.setattr(case_mod, "measure_detailed", lambda fns, config, device: Measurement(list(next(calls)), {}))
    ctx = case_mod.CaseContext(config=TimingConfig(ci_target_pct=ci_target_pct), device=torch.device("cuda"))
    return case_mod._measure_settled(lambda: None, ctx)


def test_an_unsettled_median_is_timed_again_and_the_better_known_one_kept(monkeypatch):
    steady = [1.0 + 0.001 * (i % 5) for i in range(40)]
    split = [1.0] * 18 + [2.0] * 22  # a slow mode for part of the case: its median lands there, CI wide
    samples, info = _retime_with(monkeypatch, split, steady)
    assert samples == steady
    assert info["retimed"]["kept"] == "second" and info["retimed"]["first_median_ms"] == 2.0
    assert info["retimed"]["first_ci_pct"] > 5 > info["retimed"]["second_ci_pct"]
    samples, info = _retime_with(monkeypatch, split, [1.0] * 19 + [3.0] * 21)  # the second is worse: first kept
    assert samples == split and info["retimed"]["kept"] == "first"
    samples, info = _retime_with(monkeypatch, steady)  # settled: one measurement, nothing added
    assert samples == steady and "retimed" not in info
    samples, info = _retime_with(monkeypatch, split, ci_target_pct=0)  # a fixed sample count asked for: as is
    assert samples == split and "retimed" not in info

"""Statistics of samples (bootstrap CI, outliers) and the sampling policy (repeat + minimum time)."""

import numpy as np
import pytest

from attnbench.timing import TimingConfig
from attnbench.timing.cpu import time_cpu
from attnbench.timing.stats import bootstrap_median_ci, describe, outliers


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


def test_outliers_counted_not_dropped():
    x = [1.0] * 20 + [1.1] * 20 + [5.0, 6.0] + [0.1]
    out = outliers(x)
    assert out["high"] == 2 and out["low"] == 1
    assert out["fences_ms"][0] < 1.0 < 1.1 < out["fences_ms"][1] < 5.0
    info = describe(x)
    assert info["outliers"]["high"] == 2 and info["measured_ms"] == pytest.approx(sum(x))
    assert info["median_ci95_ms"][0] <= np.median(x) <= info["median_ci95_ms"][1]


def test_sampling_policy_repeat_is_a_minimum_and_time_is_capped():
    cfg = TimingConfig(repeat=10, min_time_ms=100.0, max_repeat=500)
    assert cfg.samples_wanted([], "cuda") == 10
    assert cfg.samples_wanted([1.0] * 10, "cuda") == 90          # 10 ms measured, 1 ms each
    assert cfg.samples_wanted([20.0] * 10, "cuda") == 0          # 200 ms >= 100 ms
    assert cfg.samples_wanted([0.001] * 10, "cuda") == 490       # capped at max_repeat
    assert cfg.samples_wanted([0.001] * 500, "cuda") == 0
    default = TimingConfig(repeat=3)
    assert default.min_time_for("cuda") == 200.0 and default.min_time_for("cpu") == 0.0
    assert default.samples_wanted([0.01] * 3, "cpu") == 0


@pytest.mark.parametrize("kwargs", [dict(mode="fast"), dict(min_time_ms=-1.0), dict(repeat=5, max_repeat=2),
                                    dict(graph_max_copies=0)])
def test_bad_timing_config(kwargs):
    with pytest.raises(ValueError):
        TimingConfig(**kwargs)


def test_cpu_timer_keeps_sampling_until_min_time():
    calls = []
    samples = time_cpu(lambda: calls.append(sum(range(2000))), warmup=1, repeat=3, min_time_ms=5.0, max_repeat=100000)
    assert len(samples) >= 3 and sum(samples) >= 5.0
    assert len(calls) == len(samples) + 1

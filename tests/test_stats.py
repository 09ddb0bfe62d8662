from perfloop import stats


def test_median_interval_ranks_give_at_least_95_percent():
    assert stats.median_ci_ranks(10) == (1, 8)      # 97.9% for n=10
    assert stats.median_ci_ranks(5) == (0, 4)       # too few samples: the whole range
    lo, hi = stats.median_ci_ranks(100)
    assert (lo, hi) == (39, 60)


def test_summary_ignores_outliers():
    s = stats.summarize([1.0] * 9 + [100.0])
    assert s.median == 1.0 and s.ci_high == 1.0


def test_paired_rounds_cancel_drift_that_hits_both_variants():
    drift = [1.0, 1.0, 1.2, 1.0, 1.3, 1.0, 1.0, 1.25, 1.0, 1.0]
    incumbent = [0.26 * d for d in drift]
    candidate = [0.25 * d for d in drift]
    c = stats.compare(incumbent, candidate)
    assert abs(c.ratio - 0.25 / 0.26) < 1e-9 and c.ci_high < 1.0


def test_noise_of_a_control_is_its_deviation_or_its_halfwidth():
    assert abs(stats.noise_of(stats.Comparison(1.004, 1.001, 1.006)) - 0.004) < 1e-12
    assert abs(stats.noise_of(stats.Comparison(1.0, 0.99, 1.01)) - 0.01) < 1e-12

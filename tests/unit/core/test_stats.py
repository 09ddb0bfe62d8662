import pytest

from perfloop.core import stats


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


def test_floor_uses_the_tensor_peak_so_a_matmul_faster_than_cublas_is_not_broken():
    from perfloop.contract import roofline

    env = {"sm": "sm_90", "sm_count": 132, "clock_sm_max": "1980"}
    peak = roofline.peak_tensor_tflops(env)
    assert abs(peak - 132 * 1980e6 * 4096 / 1e12) < 1e-9
    measured = {"copy_gbps": 3000.0, "bf16_tflops": 772.0, "peak_tensor_tflops": peak}
    flops = 2 * 4096 ** 3
    # cuBLAS's own time (178 us) is above the floor, not at it
    assert roofline.floor_ms(0, flops, measured) < flops / 772e9
    assert roofline.floor_ms(0, flops, {**measured, "peak_tensor_tflops": None}) == flops / 772e9
    assert roofline.peak_tensor_tflops({"sm": "sm_75", "sm_count": 40, "clock_sm_max": "1500"}) is None
    assert roofline.peak_tensor_tflops({"sm": "sm_90", "clock_sm_max": "[N/A]", "sm_count": 1}) is None


def test_the_floor_leaves_out_the_writes_the_clock_cannot_see_and_uses_the_faster_bandwidth():
    from perfloop.contract import roofline

    base = {"copy_gbps": 3000.0, "bandwidth_gbps": 3150.0, "bf16_tflops": 700.0,
            "peak_tensor_tflops": None}
    gb = 1e9
    assert roofline.floor_ms(gb, 0, base) == pytest.approx(gb / 3150e6)
    # up to one L2 (50 MB) of the last writes is written back after the window
    assert roofline.floor_ms(gb, 0, {**base, "l2_bytes": 50e6}) == pytest.approx(0.95e9 / 3150e6)
    # never more than half the bytes (the most a kernel can write of what it moves)
    assert roofline.floor_ms(60e6, 0, {**base, "l2_bytes": 50e6}) == pytest.approx(30e6 / 3150e6)
    assert roofline.floor_ms(gb, 0, {"copy_gbps": 3000.0, "bf16_tflops": 700.0}) == \
        pytest.approx(gb / 3000e6)   # ceilings measured before the add bandwidth existed


def test_bench_shows_the_paired_ratio_that_its_interval_belongs_to():
    from perfloop.commands import bench
    from perfloop.measure import phases

    # drift: round 2 runs everything 20% slower; the pooled medians then mislead, the paired
    # per-round ratios do not (the second variant is 2% slower in every round)
    inc = [[1.0] * 5, [1.2] * 5, [1.0] * 5, [1.2] * 5, [1.2] * 5]
    other = [[1.02] * 5, [1.224] * 5, [1.02] * 5, [1.224] * 5, [1.02] * 5]
    timed = {"shapes": {"s": {"rounds": {"incumbent": inc, "incumbent-again": inc,
                                         "torch-compile": other},
                              "bytes": 1, "flops": 1, "reps": 5}}}
    summary = phases.summarize_pass(timed)
    rows = bench.table_rows(summary, {"incumbent": "cutile", "torch-compile": "torch-compile"})
    tc = next(r for r in rows if r["variant"] == "torch-compile")
    assert tc["ratio_ci"][0] <= tc["vs_cutile"] <= tc["ratio_ci"][1]
    assert abs(tc["vs_cutile"] - 1.02) < 1e-9
    pooled = summary["s"]["variants"]["torch-compile"]["median_ms"] / \
        summary["s"]["variants"]["incumbent"]["median_ms"]
    assert abs(pooled - 1.02) > 0.05   # what the column showed before


def test_bench_and_its_record_show_tflops_for_tensor_core_flops_only():
    from perfloop.commands import bench
    from perfloop.measure import phases

    rounds = [[2.0] * 3] * 3
    shape = {"rounds": {"incumbent": rounds, "incumbent-again": rounds}, "bytes": 4e6,
             "flops": 1e12, "reps": 3, "floor_ms": 1.0}
    tensor = phases.summarize_pass({"shapes": {"s": {
        **shape, "flops_by_unit": {"tensor.bfloat16": 1e12, "sfu": 1e9}}}})
    assert tensor["s"]["variants"]["incumbent"]["tflops"] == pytest.approx(500.0)   # 1e12 / 2 ms
    plain = phases.summarize_pass({"shapes": {"s": {**shape, "flops_by_unit": {"fp32": 1e12}}}})
    assert "tflops" not in plain["s"]["variants"]["incumbent"]
    env = {"gpu_name": "H100", "driver": "1", "cutile": "1.7.0", "torch": "2"}
    for summary, column in ((tensor, True), (plain, False)):
        text = bench.render({"kernel": "k", "headline": "s", "environment": env,
                             "ceilings": {"copy_gbps": 3000.0},
                             "rows": bench.table_rows(summary, {"incumbent": "cutile"})})
        assert ("TFLOP/s" in text) == column
        assert (" 500.0 |" in text) == column


# ---- adversarial inputs: a busy machine's zeros, lost batches, one or identical samples ----
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import math  # noqa: E402

TIMES = st.one_of(st.just(0.0), st.just(math.nan), st.just(-0.001),
                  st.floats(min_value=1e-6, max_value=1e3))
ROUNDS = st.integers(min_value=1, max_value=12)


@given(st.lists(TIMES, min_size=1, max_size=40))
def test_a_summary_of_any_samples_is_ordered_or_all_nan(values):
    s = stats.summarize(values)
    assert s.n == len(values)
    if any(math.isnan(v) for v in values):
        assert math.isnan(s.median) and math.isnan(s.ci_low) and math.isnan(s.ci_high)
    else:
        assert s.ci_low <= s.median <= s.ci_high


@given(ROUNDS.flatmap(lambda n: st.tuples(st.lists(TIMES, min_size=n, max_size=n),
                                          st.lists(TIMES, min_size=n, max_size=n))))
def test_a_comparison_never_divides_by_zero_nor_reads_a_gain_from_no_time(pair):
    incumbent, candidate = pair
    c = stats.compare(incumbent, candidate)
    # a round with no time on either side (0, negative, lost) has no ratio: NaN, never a
    # gain of 100% and never a ZeroDivisionError
    if any(not (i > 0 and x > 0) for i, x in zip(incumbent, candidate)):
        assert math.isnan(c.ratio)
    else:
        assert c.ratio > 0 and c.ci_low <= c.ratio <= c.ci_high
    assert not c.gain > 1 - 1e-12 if not math.isnan(c.ratio) else math.isnan(c.gain)


@given(st.floats(min_value=1e-6, max_value=1e3), ROUNDS)
def test_identical_rounds_compare_as_one(t, n):
    c = stats.compare([t] * n, [t] * n)
    assert c.ratio == c.ci_low == c.ci_high == 1.0
    assert stats.noise_of(c) == 0.0


def test_one_round_has_the_whole_range_as_its_interval():
    c = stats.compare([2.0], [1.0])
    assert c.ratio == c.ci_low == c.ci_high == 0.5


def test_no_rounds_at_all_is_an_error_not_a_ratio():
    with pytest.raises(ValueError):
        stats.compare([], [])
    with pytest.raises(ValueError):
        stats.summarize([])


def test_the_keep_rule_has_one_home_the_decision_and_the_timer_read():
    from perfloop.plan import decide

    assert decide.real_gain is stats.real_gain
    assert stats.real_gain(stats.Comparison(0.97, 0.95, 0.99))             # interval below 1
    assert not stats.real_gain(stats.Comparison(0.97, 0.94, 1.002))        # it includes 1
    assert not stats.real_gain(stats.Comparison(0.97, 0.95, 0.99, 0.04))   # within the noise
    assert not stats.real_gain(stats.Comparison(0.997, 0.995, 0.999), min_gain=0.005)
    assert not stats.real_gain(stats.Comparison(*[float("nan")] * 3))      # a lost round

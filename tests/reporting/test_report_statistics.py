"""The report's statistics against hand computations and brute force over all draws."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bertkit.errors import BertkitError
from bertkit.reporting.results import RunResult
from bertkit.reporting.statistics import (
    aso_epsilon,
    best_grid_point,
    bootstrap_difference_ci,
    compare_groups,
    expected_max_curve,
    holm_adjust,
    seeds_needed,
    summarize,
)


def test_summarize_matches_hand_computation():
    s = summarize([4, 1, 10, 3, 2])
    # deviations from 4: 0 -3 6 -1 -2 -> squares sum 50, sample variance 50 / 4
    assert s == {"n": 5, "mean": 4.0, "std": math.sqrt(12.5), "median": 3.0,
                 "min": 1.0, "max": 10.0}
    assert summarize([1, 2, 3, 4])["median"] == 2.5


def test_summarize_single_value_has_undefined_std():
    s = summarize([0.75])
    assert s["n"] == 1 and s["mean"] == 0.75 and s["median"] == 0.75
    assert math.isnan(s["std"])


@pytest.mark.parametrize("values", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects_empty_and_non_finite(values):
    with pytest.raises(BertkitError):
        summarize(values)


def run(task, point, value, seed=1):
    return RunResult(run_dir=Path("r"), recipe="glue", task=task, model="m", seed=seed,
                     main_metric="accuracy", main_value=value, grid_point=point)


A, B, C = (2e-5, 32, 3.0), (3e-5, 32, 3.0), (5e-5, 16, 2.0)


def test_best_grid_point_is_highest_mean_not_highest_single_run():
    runs = [run("rte", A, 0.5), run("rte", A, 0.75),          # mean 0.625
            run("rte", C, 0.875), run("rte", C, 0.25),        # best run, mean 0.5625
            run("rte", B, 0.5), run("rte", B, 0.5)]           # mean 0.5
    point, summary = best_grid_point(runs)
    assert point == A
    assert summary["mean"] == 0.625 and summary["n"] == 2
    assert summary["min"] == 0.5 and summary["max"] == 0.75


def test_best_grid_point_ties_go_to_more_runs_then_smallest_point():
    runs = [run("rte", B, 0.5), run("rte", B, 0.75),                         # 0.625, n=2
            run("rte", C, 0.625), run("rte", C, 0.5), run("rte", C, 0.75)]   # 0.625, n=3
    for order in itertools.permutations(runs):
        assert best_grid_point(list(order))[0] == C
    runs = [run("rte", C, 0.5), run("rte", C, 0.75), run("rte", B, 0.75), run("rte", B, 0.5)]
    for order in itertools.permutations(runs):
        assert best_grid_point(list(order))[0] == B   # same mean and n: smaller lr wins


def test_best_grid_point_refuses_mixed_tasks_and_no_runs():
    with pytest.raises(BertkitError, match="several tasks"):
        best_grid_point([run("rte", A, 0.5), run("mrpc", A, 0.5)])
    with pytest.raises(BertkitError):
        best_grid_point([])


SCORES = [0.7, 0.9, 0.7, 0.8, 0.9, 0.6]   # ties on purpose


def test_expected_max_without_replacement_equals_all_subsets():
    curve = expected_max_curve(SCORES)
    assert curve.shape == (len(SCORES),)
    for n in range(1, len(SCORES) + 1):
        maxima = [max(c) for c in itertools.combinations(SCORES, n)]
        assert curve[n - 1] == pytest.approx(sum(maxima) / len(maxima), rel=1e-12, abs=0)
    assert curve[0] == pytest.approx(np.mean(SCORES), rel=1e-12)
    assert curve[-1] == pytest.approx(0.9, rel=1e-12)


def test_expected_max_with_replacement_equals_all_tuples():
    curve = expected_max_curve(SCORES, replacement=True)
    for n in range(1, len(SCORES) + 1):
        maxima = [max(t) for t in itertools.product(SCORES, repeat=n)]
        assert curve[n - 1] == pytest.approx(sum(maxima) / len(maxima), rel=1e-12, abs=0)
    # beyond N trials, and strictly below the without-replacement curve for 1 < n
    small = [0.2, 0.5, 0.4]
    curve = expected_max_curve(small, n_max=6, replacement=True)
    assert curve.shape == (6,)
    for n in range(1, 7):
        maxima = [max(t) for t in itertools.product(small, repeat=n)]
        assert curve[n - 1] == pytest.approx(sum(maxima) / len(maxima), rel=1e-12, abs=0)
    exact = expected_max_curve(small)
    assert curve[0] == pytest.approx(exact[0])
    assert (curve[1:3] < exact[1:3]).all()


def test_expected_max_is_stable_for_many_trials():
    scores = np.random.default_rng(0).random(3000)
    for replacement in (False, True):
        curve = expected_max_curve(scores, replacement=replacement)
        assert np.isfinite(curve).all()
        assert (np.diff(curve) >= -1e-12).all()
        assert curve[0] == pytest.approx(scores.mean(), rel=1e-9)
    assert expected_max_curve(scores)[-1] == pytest.approx(scores.max(), rel=1e-9)


def test_expected_max_rejects_impossible_requests():
    with pytest.raises(BertkitError, match="exceeds"):
        expected_max_curve([0.1, 0.2], n_max=3)
    with pytest.raises(BertkitError):
        expected_max_curve([])
    with pytest.raises(BertkitError):
        expected_max_curve([0.1], n_max=0)


def test_welch_matches_hand_computation():
    # a: mean 2, var 1; b: mean 10/3, var 7/3 -> se^2 = 1/3 + 7/9 = 10/9
    r = compare_groups([1, 2, 3], [2, 3, 5])
    assert r["test"] == "Welch's t-test"
    assert r["difference"] == pytest.approx(4 / 3, rel=1e-12)
    assert r["se"] == pytest.approx(math.sqrt(10 / 9), rel=1e-12)
    assert r["t"] == pytest.approx(4 / math.sqrt(10), rel=1e-12)
    # (10/9)^2 / ((1/3)^2 / 2 + (7/9)^2 / 2) = 100/29
    assert r["df"] == pytest.approx(100 / 29, rel=1e-12)
    half = stats.t.ppf(0.975, 100 / 29) * math.sqrt(10 / 9)
    assert r["ci_low"] == pytest.approx(4 / 3 - half, rel=1e-12)
    assert r["ci_high"] == pytest.approx(4 / 3 + half, rel=1e-12)
    assert r["p_value"] == pytest.approx(2 * stats.t.sf(4 / math.sqrt(10), 100 / 29), rel=1e-9)
    narrow = compare_groups([1, 2, 3], [2, 3, 5], confidence=0.8)
    assert narrow["ci_high"] - narrow["ci_low"] < r["ci_high"] - r["ci_low"]


def test_welch_matches_scipy_on_glue_like_scores():
    a = [0.80, 0.82, 0.84, 0.81]
    b = [0.85, 0.86, 0.88, 0.84, 0.87]
    r = compare_groups(a, b, confidence=0.9)
    ref = stats.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(confidence_level=0.9)
    assert r["t"] == pytest.approx(ref.statistic, rel=1e-12) and r["t"] > 0
    assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert r["df"] == pytest.approx(ref.df, rel=1e-12)
    assert r["ci_low"] == pytest.approx(ci.low, rel=1e-10)
    assert r["ci_high"] == pytest.approx(ci.high, rel=1e-10)
    assert r["difference"] == pytest.approx(np.mean(b) - np.mean(a), rel=1e-12)
    swapped = compare_groups(b, a, confidence=0.9)
    assert swapped["difference"] == pytest.approx(-r["difference"])
    assert swapped["t"] == pytest.approx(-r["t"])


def test_paired_matches_hand_and_scipy_and_pairs_by_seed():
    # differences 1, 1, 2: mean 4/3, sd sqrt(1/3), se 1/3, t 4, df 2
    r = compare_groups([1, 2, 3], [2, 3, 5], paired=True)
    assert r["test"] == "paired t-test"
    assert r["t"] == pytest.approx(4.0, rel=1e-12)
    assert r["df"] == 2.0
    assert r["se"] == pytest.approx(1 / 3, rel=1e-12)
    half = stats.t.ppf(0.975, 2) / 3
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((4 / 3 - half, 4 / 3 + half))
    a, b = [0.80, 0.82, 0.84, 0.81], [0.83, 0.82, 0.88, 0.84]
    ref = stats.ttest_rel(b, a)
    r = compare_groups(a, b, paired=True)
    assert r["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-10)
    ci = ref.confidence_interval(confidence_level=0.95)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-10)
    by_seed = compare_groups(dict(zip([1, 2, 3, 4], a, strict=True)),
                             {4: b[3], 2: b[1], 1: b[0], 3: b[2]}, paired=True)
    assert by_seed["t"] == pytest.approx(ref.statistic, rel=1e-12)
    # the same numbers unpaired are a different test with a different answer
    assert compare_groups(a, b)["p_value"] != pytest.approx(ref.pvalue)


def test_compare_groups_refuses_too_few_or_unpairable_values():
    with pytest.raises(BertkitError, match="at least 2"):
        compare_groups([0.8], [0.7, 0.9])
    with pytest.raises(BertkitError, match="same seeds"):
        compare_groups({1: 0.8, 2: 0.7}, {1: 0.8, 3: 0.9}, paired=True)
    with pytest.raises(BertkitError, match="differ in size"):
        compare_groups([0.8, 0.7], [0.8, 0.9, 0.7], paired=True)


def test_compare_groups_without_variance_gives_nan_not_a_crash():
    r = compare_groups([0.5, 0.5], [0.75, 0.75])
    assert r["difference"] == 0.25
    assert math.isnan(r["t"]) and math.isnan(r["p_value"]) and math.isnan(r["ci_low"])


def test_holm_on_a_hand_made_case():
    # sorted: a 0.01 (x3), c 0.03 (x2), b 0.04 (x1 -> 0.04, raised to c's 0.06), e 0.5 -> 0.5
    # with m = 4: a 0.04, c 0.09, b max(0.09, 0.08) = 0.09, e max(0.09, 0.5) = 0.5
    adjusted = holm_adjust({"a": 0.01, "b": 0.04, "c": 0.03, "e": 0.5, "nan": math.nan})
    assert adjusted["a"] == pytest.approx(0.04)
    assert adjusted["c"] == pytest.approx(0.09)
    assert adjusted["b"] == pytest.approx(0.09)
    assert adjusted["e"] == pytest.approx(0.5)
    assert math.isnan(adjusted["nan"])
    assert holm_adjust({"only": 0.03}) == {"only": 0.03}
    assert holm_adjust({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}


@pytest.mark.parametrize("effect, seeds", [(1.0, 17), (0.8, 26), (0.5, 64)])
def test_seeds_needed_matches_cohens_power_table(effect, seeds):
    """Two-sided alpha 0.05, power 0.8, equal spreads: Cohen (1988), Table 2.4.1."""
    assert seeds_needed(1.0, 1.0, effect) == seeds
    assert seeds_needed(2.0, 2.0, 2 * effect) == seeds  # only the ratio matters


def test_seeds_needed_for_paired_and_unequal_spreads():
    # one-sample (paired) t-test, d = 0.5, power 0.8: 34 pairs (Cohen's table for the
    # one-sample case, n = 33.4 by the normal approximation plus the t correction)
    assert seeds_needed(9.0, 9.0, 0.5, paired_std=1.0) == 34
    # Welch with unequal spreads needs more than with both at the smaller spread
    assert seeds_needed(1.0, 2.0, 1.0) > seeds_needed(1.0, 1.0, 1.0)
    assert seeds_needed(1.0, 1.0, 1e-6, max_seeds=50) is None
    with pytest.raises(BertkitError, match="must be positive"):
        seeds_needed(1.0, 1.0, 0.0)


def test_bootstrap_interval_matches_an_independent_resampling():
    rng = np.random.default_rng(7)
    a, b = rng.normal(80, 2, size=8).tolist(), rng.normal(83, 1, size=10).tolist()
    low, high = bootstrap_difference_ci(a, b, 0.95, resamples=20000, seed=3)
    draws = np.random.default_rng(11)
    diffs = [draws.choice(b, len(b)).mean() - draws.choice(a, len(a)).mean()
             for _ in range(20000)]
    assert low == pytest.approx(np.percentile(diffs, 2.5), abs=0.1)
    assert high == pytest.approx(np.percentile(diffs, 97.5), abs=0.1)
    assert 0 < low < np.mean(b) - np.mean(a) < high


def test_bootstrap_interval_paired_resamples_pairs():
    a = [80.0, 70.0, 90.0, 60.0]
    b = [81.0, 71.0, 91.0, 61.0]  # always one point better: every paired resample says 1
    assert bootstrap_difference_ci(a, b, paired=True, resamples=2000) == pytest.approx((1, 1))
    low, high = bootstrap_difference_ci(a, b, resamples=2000)  # unpaired: the spread shows
    assert low < -5 and high > 5


@pytest.mark.slow
def test_aso_is_deepsigs_and_orders_the_groups():
    from deepsig import aso

    a = [80.1, 79.5, 81.0, 80.4, 79.9]
    b = [82.0, 81.7, 82.9, 81.2, 82.4]
    assert aso_epsilon(a, b, seed=5) == aso(b, a, show_progress=False, seed=5)
    assert aso_epsilon(a, b, seed=5) < 0.2  # B dominates A
    assert aso_epsilon(b, a, seed=5) > 0.8  # and not the other way round
    with pytest.raises(BertkitError, match="at least 2 values"):
        aso_epsilon([1.0], b)

"""Seed statistics, grid selection, expected max over trials and significance for bertkit-report.

Pure functions on plain numbers, so that every figure in a report can be checked by hand.
Means are computed with math.fsum (correctly rounded), so they do not depend on the order in
which runs were found, and ties between grid points are real ties.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
from scipy import special, stats

from bertkit.errors import BertkitError


def _finite_values(values: Iterable[float], what: str = "values") -> list[float]:
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise BertkitError(f"{what}: non-finite value in {out}")
    return out


def summarize(values: Iterable[float]) -> dict:
    """n, mean, std, median, min, max of the values (e.g. one score per seed).

    std is the sample standard deviation (ddof=1); it is nan for a single value, where it is
    undefined — a 0.0 would claim a seed variance of zero that was never measured.
    """
    data = _finite_values(values)
    if not data:
        raise BertkitError("summarize: no values")
    n = len(data)
    return {
        "n": n,
        "mean": math.fsum(data) / n,
        "std": float(np.std(data, ddof=1)) if n > 1 else math.nan,
        "median": float(np.median(data)),
        "min": min(data),
        "max": max(data),
    }


def best_grid_point(runs: Sequence, key=None) -> tuple[tuple, dict]:
    """The grid point of one task's runs whose mean main_value over seeds is highest.

    runs: objects with .task, .grid_point and .main_value (RunResult); key: what a point is
    (default the run's grid_point; the report passes row and grid point together when runs
    of several rows compete). Returns (point, summarize(main values at that point)). Ties of
    the mean go to the point with more runs (more evidence), then to the smallest point tuple
    (learning_rate, train_batch_size, num_train_epochs), so the choice never depends on the
    order of the runs.
    """
    if not runs:
        raise BertkitError("best_grid_point: no runs")
    tasks = sorted({run.task for run in runs})
    if len(tasks) > 1:
        raise BertkitError(f"best_grid_point: runs of several tasks {tasks}; pass one task")
    by_point: dict[tuple, list[float]] = {}
    for run in runs:
        point = key(run) if key is not None else tuple(run.grid_point)
        by_point.setdefault(point, []).append(run.main_value)
    summaries = {point: summarize(values) for point, values in by_point.items()}
    best = min(summaries, key=lambda p: (-summaries[p]["mean"], -summaries[p]["n"], p))
    return best, summaries[best]


def expected_max_curve(
    scores: Iterable[float], n_max: int | None = None, replacement: bool = False
) -> np.ndarray:
    """Expected best dev score of n trials, for n = 1..n_max (Dodge et al., 2019).

    Element k is the value for n = k + 1. With v_(1) <= ... <= v_(N) the sorted scores:

    replacement=False (default): the exact expectation of the max of n trials drawn
      without replacement from the N that were run,
      E_n = sum_i v_(i) C(i-1, n-1) / C(N, n); it only uses trials that exist, so n <= N,
      E_1 is the mean and E_N the max.
    replacement=True: the bootstrap form of "Show Your Work" (their eq. 1 with the empirical
      CDF), E_n = sum_i v_(i) ((i/N)^n - ((i-1)/N)^n); use it to reproduce their curves or
      to extrapolate past N (n_max may then exceed N). It is biased low against the
      without-replacement curve for n > 1, as duplicates of a trial add nothing.

    n_max defaults to N. Weights are computed in log space (scipy.special.gammaln), so
    thousands of trials neither overflow nor lose the small weights.
    """
    values = np.sort(np.asarray(_finite_values(scores, "expected_max_curve"), dtype=float))
    big_n = len(values)
    if big_n == 0:
        raise BertkitError("expected_max_curve: no scores")
    n_max = big_n if n_max is None else int(n_max)
    if n_max < 1:
        raise BertkitError(f"expected_max_curve: n_max={n_max} must be at least 1")
    if not replacement and n_max > big_n:
        raise BertkitError(f"expected_max_curve: n_max={n_max} exceeds the {big_n} trials; "
                           "without replacement at most N trials can be drawn")
    i = np.arange(1, big_n + 1, dtype=float)
    curve = np.empty(n_max)
    for n in range(1, n_max + 1):
        if replacement:
            log_i = n * np.log(i / big_n)
            log_prev = n * np.log((i - 1) / big_n, where=i > 1, out=np.full(big_n, -np.inf))
            weights = np.exp(log_i) - np.exp(log_prev)
        else:
            weights = np.zeros(big_n)
            ok = i >= n  # C(i-1, n-1) = 0 below
            log_num = (special.gammaln(i[ok]) - special.gammaln(n)
                       - special.gammaln(i[ok] - n + 1))
            log_den = (special.gammaln(big_n + 1) - special.gammaln(n + 1)
                       - special.gammaln(big_n - n + 1))
            weights[ok] = np.exp(log_num - log_den)
        curve[n - 1] = float(np.dot(weights, values))
    return curve


def compare_groups(
    a: Sequence[float] | Mapping,
    b: Sequence[float] | Mapping,
    confidence: float = 0.95,
    paired: bool = False,
) -> dict:
    """Is b better than a? The difference is mean(b) - mean(a): positive when b scores higher.

    paired=False: Welch's t-test (unequal variances, scipy.stats.ttest_ind(equal_var=False)),
      with the Welch–Satterthwaite df and the confidence interval of the difference from the
      t distribution with that df.
    paired=True: the paired t-test on b - a (scipy.stats.ttest_rel), df = n - 1; for runs of
      both systems with the same seeds. When a and b are mappings {seed: score} they are
      paired by key (the key sets must match); sequences are paired by position.

    The p-value is two-sided. With no variance at all (se = 0) t, p and the interval are nan.
    """
    if not 0 < confidence < 1:
        raise BertkitError(f"compare_groups: confidence={confidence} must be in (0, 1)")
    xa, xb = _groups(a, b, paired)
    with np.errstate(divide="ignore", invalid="ignore"):
        if paired:
            diffs = xb - xa
            difference = math.fsum(diffs) / len(diffs)
            se = float(np.std(diffs, ddof=1) / math.sqrt(len(diffs)))
            df = float(len(diffs) - 1)
            test = "paired t-test"
        else:
            difference = math.fsum(xb) / len(xb) - math.fsum(xa) / len(xa)
            va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
            se = float(math.sqrt(va + vb))
            df = float((va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
                       ) if se > 0 else math.nan
            test = "Welch's t-test"
    if se > 0:
        if paired:
            result = stats.ttest_rel(xb, xa)
        else:
            result = stats.ttest_ind(xb, xa, equal_var=False)
        half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
        t_value, p_value = float(result.statistic), float(result.pvalue)
    else:
        half = t_value = p_value = math.nan
    return {
        "test": test,
        "n_a": len(xa),
        "n_b": len(xb),
        "mean_a": math.fsum(xa) / len(xa),
        "mean_b": math.fsum(xb) / len(xb),
        "difference": difference,
        "se": se,
        "t": t_value,
        "df": df,
        "p_value": p_value,
        "confidence": confidence,
        "ci_low": difference - half,
        "ci_high": difference + half,
    }


def _groups(a: Sequence[float] | Mapping, b: Sequence[float] | Mapping,
            paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """compare_groups' two groups as arrays, in pairing order when paired; refused where a
    test would be meaningless (fewer than 2 values, unmatched pairs)."""
    if paired and isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise BertkitError(f"compare_groups: paired groups need the same seeds; "
                               f"{sorted(a)} != {sorted(b)}")
        keys = sorted(a)
        a, b = [a[k] for k in keys], [b[k] for k in keys]
    xa = np.asarray(_finite_values(a.values() if isinstance(a, Mapping) else a, "group a"))
    xb = np.asarray(_finite_values(b.values() if isinstance(b, Mapping) else b, "group b"))
    if len(xa) < 2 or len(xb) < 2:
        raise BertkitError(f"compare_groups: need at least 2 values per group, "
                           f"got {len(xa)} and {len(xb)}")
    if paired and len(xa) != len(xb):
        raise BertkitError(f"compare_groups: paired groups differ in size "
                           f"({len(xa)} and {len(xb)})")
    return xa, xb


# deepsig's warning for a bootstrap sample whose two groups are identical (aso_epsilon).
DEEPSIG_ZERO_DISTANCE = "Division by zero encountered in violation ratio"


def aso_epsilon(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                num_comparisons: int = 1, seed: int = 0,
                bootstrap_iterations: int = 1000) -> float:
    """ε_min of the Almost Stochastic Order test (Dror et al., 2019; deepsig's `aso`, del
    Barrio et al.'s bound as Ulmer et al., 2022 implement it) that B is better than A: 0 when
    B's scores stochastically dominate A's, 1 when A's dominate B's; B is called better below
    a threshold (0.2 in Ulmer et al.). num_comparisons > 1 Bonferroni-corrects the confidence."""
    from deepsig import aso

    xa = _finite_values(a, "group a")
    xb = _finite_values(b, "group b")
    if len(xa) < 2 or len(xb) < 2:
        raise BertkitError(f"aso_epsilon: need at least 2 values per group, got {len(xa)} and "
                           f"{len(xb)}")
    with warnings.catch_warnings():
        # deepsig warns (once, untold which) when a bootstrap sample of the two groups is
        # identical (a squared Wasserstein distance of 0) and counts that sample's violation
        # ratio as 0.5: its documented handling, not a fault of these scores. Its other
        # warnings (a confidence level out of range, ...) are still shown.
        warnings.filterwarnings("ignore", message=DEEPSIG_ZERO_DISTANCE, category=UserWarning)
        return float(aso(xb, xa, confidence_level=confidence, num_comparisons=num_comparisons,
                         num_bootstrap_iterations=bootstrap_iterations, show_progress=False,
                         seed=seed))


def tied(a: Sequence[float] | Mapping, b: Sequence[float] | Mapping) -> bool:
    """Whether two groups hold the same scores (mappings: the same score for each key, as
    paired groups; sequences: the same scores in any order), e.g. two arms that both predict
    the majority class. Nothing tells them apart: no test is needed, and ASO's ε_min would
    read 1 both ways (neither is better), which says less than "no difference"."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(float(a[k]) == float(b[k]) for k in a)
    return sorted(map(float, a)) == sorted(map(float, b))


def bootstrap_difference_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                            paired: bool = False, resamples: int = 10000,
                            seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(b) - mean(a) (scipy.stats.bootstrap): each group
    resampled on its own, or the pairs together when paired. Makes no normality assumption,
    unlike the t interval."""
    xa = np.asarray(_finite_values(a, "group a"))
    xb = np.asarray(_finite_values(b, "group b"))
    if paired and len(xa) != len(xb):
        raise BertkitError(f"bootstrap_difference_ci: paired groups differ in size "
                           f"({len(xa)} and {len(xb)})")
    result = stats.bootstrap((xa, xb), lambda x, y, axis=-1: y.mean(axis) - x.mean(axis),
                             paired=paired, vectorized=True, n_resamples=resamples,
                             confidence_level=confidence, method="percentile",
                             random_state=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def holm_adjust(p_values: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Holm–Bonferroni-adjusted p-values (Holm, 1979): the k-th smallest of m multiplied by
    m - k + 1, made non-decreasing, capped at 1. Written here because scipy has no Holm
    (false_discovery_control is Benjamini–Hochberg) and statsmodels' multipletests would be a
    dependency for these few lines. nan p-values (no variance) stay nan and do not count."""
    finite = sorted((p, key) for key, p in p_values.items() if math.isfinite(p))
    m, running, adjusted = len(finite), 0.0, {}
    for rank, (p, key) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[key] = running
    return {key: adjusted.get(key, math.nan) for key in p_values}


def seeds_needed(std_a: float, std_b: float, difference: float, alpha: float = 0.05,
                 power: float = 0.8, paired_std: float | None = None,
                 max_seeds: int = 10000) -> int | None:
    """Seeds per arm for a two-sided t-test at level alpha to detect a true difference of
    `difference` with the given power, at these standard deviations: Welch's test (its
    Welch–Satterthwaite df, the noncentral t for the power), or with paired_std (the standard
    deviation of the per-seed differences) the paired test. None: more than max_seeds."""
    if difference <= 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise BertkitError(f"seeds_needed: difference ({difference}) must be positive, alpha "
                           f"({alpha}) and power ({power}) in (0, 1)")
    for n in range(2, max_seeds + 1):
        if paired_std is not None:
            se, df = paired_std / math.sqrt(n), n - 1
        else:
            va, vb = std_a**2 / n, std_b**2 / n
            se = math.sqrt(va + vb)
            df = (va + vb) ** 2 / ((va**2 + vb**2) / (n - 1)) if se > 0 else n - 1
        if se == 0:
            return n
        critical = stats.t.ppf(1 - alpha / 2, df)
        shift = difference / se
        reached = stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift)
        if reached >= power:
            return n
    return None

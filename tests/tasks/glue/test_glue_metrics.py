"""bertkit.tasks.glue.metrics against independent computations from first principles (confusion
counts, ranks) in numpy, and against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue.metrics import (
    METRICS,
    check_metric_names,
    compute_metrics,
    predictions_from_logits,
)
from tests.conftest import GLUE_TASKS, compose_config

# --- Independent reference implementations ------------------------------------------------


def confusion(pred: np.ndarray, gold: np.ndarray) -> tuple[int, int, int, int]:
    """(tp, tn, fp, fn) with class 1 as the positive class."""
    tp = int(np.sum((pred == 1) & (gold == 1)))
    tn = int(np.sum((pred == 0) & (gold == 0)))
    fp = int(np.sum((pred == 1) & (gold == 0)))
    fn = int(np.sum((pred == 0) & (gold == 1)))
    return tp, tn, fp, fn


def ref_accuracy(pred, gold) -> float:
    return sum(int(p == g) for p, g in zip(pred, gold, strict=True)) / len(gold)


def ref_f1(pred, gold) -> float:
    tp, _, fp, fn = confusion(pred, gold)
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def ref_mcc_binary(pred, gold) -> float:
    tp, tn, fp, fn = confusion(pred, gold)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denominator == 0 else (tp * tn - fp * fn) / denominator


def ref_mcc_multiclass(pred, gold) -> float:
    """Gorodkin's R_K from the K x K confusion matrix C (rows gold, columns predicted)."""
    classes = sorted(set(pred.tolist()) | set(gold.tolist()))
    matrix = np.array([[np.sum((gold == a) & (pred == b)) for b in classes] for a in classes],
                      dtype=float)
    s = matrix.sum()
    c = np.trace(matrix)
    t = matrix.sum(axis=1)  # how often each class truly occurs
    p = matrix.sum(axis=0)  # how often each class is predicted
    return (c * s - p @ t) / math.sqrt((s * s - p @ p) * (s * s - t @ t))


def ref_pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = x - x.mean(), y - y.mean()
    return float((dx * dy).sum() / math.sqrt((dx * dx).sum() * (dy * dy).sum()))


def average_ranks(values) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span."""
    values = np.asarray(values, dtype=float)
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = np.empty(len(values))
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def ref_spearman(x, y) -> float:
    return ref_pearson(average_ranks(x), average_ranks(y))


# --- Fixed predictions --------------------------------------------------------------------


RNG = np.random.default_rng(1234)
GOLD_BINARY = RNG.integers(0, 2, size=300)
# Predictions that agree with the gold label about 70% of the time.
PRED_BINARY = np.where(RNG.random(300) < 0.7, GOLD_BINARY, 1 - GOLD_BINARY)
GOLD_3WAY = RNG.integers(0, 3, size=300)
PRED_3WAY = np.where(RNG.random(300) < 0.6, GOLD_3WAY, RNG.integers(0, 3, size=300))
GOLD_SCORES = np.round(RNG.uniform(0, 5, size=200), 1)  # rounded: many ties, as in STS-B
PRED_SCORES = (GOLD_SCORES + RNG.normal(0, 1.2, size=200)).astype(np.float32)


def test_reference_average_ranks():
    assert average_ranks([10, 30, 20, 20]).tolist() == [1.0, 4.0, 2.5, 2.5]


def test_accuracy_matches_reference():
    value = compute_metrics(["accuracy"], PRED_BINARY, GOLD_BINARY)["accuracy"]
    assert value == pytest.approx(ref_accuracy(PRED_BINARY, GOLD_BINARY), abs=1e-12)
    value3 = compute_metrics(["accuracy"], PRED_3WAY, GOLD_3WAY)["accuracy"]
    assert value3 == pytest.approx(ref_accuracy(PRED_3WAY, GOLD_3WAY), abs=1e-12)


def test_f1_matches_reference():
    value = compute_metrics(["f1"], PRED_BINARY, GOLD_BINARY)["f1"]
    assert value == pytest.approx(ref_f1(PRED_BINARY, GOLD_BINARY), abs=1e-12)


def test_f1_is_of_the_positive_class_1():
    """Binary F1 of class 1, not class 0 and not a macro average."""
    gold = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    pred = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    # class 1: tp=1, fp=1, fn=2 -> F1 = 2/(2+1+2) = 0.4; class 0: tp=6, fp=2, fn=1 -> 12/15.
    assert compute_metrics(["f1"], pred, gold)["f1"] == pytest.approx(0.4, abs=1e-12)


def test_f1_without_positive_predictions_is_zero():
    assert compute_metrics(["f1"], np.zeros(4, int), np.array([0, 1, 1, 0]))["f1"] == 0.0


def test_mcc_matches_reference():
    value = compute_metrics(["matthews_correlation"], PRED_BINARY, GOLD_BINARY)
    expected = ref_mcc_binary(PRED_BINARY, GOLD_BINARY)
    assert value["matthews_correlation"] == pytest.approx(expected, abs=1e-12)
    assert 0.2 < expected < 0.6  # the fixed predictions are informative, not degenerate
    # The multiclass formula reduces to the binary one for two classes.
    assert ref_mcc_multiclass(PRED_BINARY, GOLD_BINARY) == pytest.approx(expected, abs=1e-12)


def test_mcc_multiclass_matches_reference():
    value = compute_metrics(["matthews_correlation"], PRED_3WAY, GOLD_3WAY)
    expected = ref_mcc_multiclass(PRED_3WAY, GOLD_3WAY)
    assert value["matthews_correlation"] == pytest.approx(expected, abs=1e-12)


def test_hand_computed_binary_metrics():
    # gold: 1 1 1 1 1 0 0 0
    # pred: 1 1 1 0 0 0 0 1
    # tp = 3, fn = 2, tn = 2, fp = 1
    # accuracy = (3 + 2) / 8 = 0.625
    # F1 = 2*3 / (2*3 + 1 + 2) = 6/9 = 2/3
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))
    #     = (3*2 - 1*2) / sqrt(4 * 5 * 3 * 4) = 4 / sqrt(240) = 0.2581988897...
    gold = np.array([1, 1, 1, 1, 1, 0, 0, 0])
    pred = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    values = compute_metrics(["accuracy", "f1", "matthews_correlation"], pred, gold)
    assert values["accuracy"] == pytest.approx(0.625, abs=1e-12)
    assert values["f1"] == pytest.approx(2 / 3, abs=1e-12)
    assert values["matthews_correlation"] == pytest.approx(0.2581988897471611, abs=1e-12)


def test_hand_computed_mcc_perfect_and_inverted():
    gold = np.array([0, 1, 0, 1, 1])
    assert compute_metrics(["matthews_correlation"], gold, gold)["matthews_correlation"] == 1.0
    inverted = compute_metrics(["matthews_correlation"], 1 - gold, gold)
    assert inverted["matthews_correlation"] == pytest.approx(-1.0, abs=1e-12)


def test_pearson_and_spearman_match_reference():
    values = compute_metrics(["pearson", "spearman"], PRED_SCORES, GOLD_SCORES)
    assert values["pearson"] == pytest.approx(ref_pearson(PRED_SCORES, GOLD_SCORES), abs=1e-6)
    assert values["spearman"] == pytest.approx(ref_spearman(PRED_SCORES, GOLD_SCORES), abs=1e-9)
    # Rank and linear correlation differ here, so a swap of the two would be caught.
    assert abs(values["pearson"] - values["spearman"]) > 1e-4


def test_hand_computed_correlations():
    # x = 1 2 3, y = 1 3 2: deviations (-1, 0, 1) and (-1, 1, 0); covariance sum = 1,
    # sums of squares 2 and 2 -> r = 1 / sqrt(4) = 0.5. The values are their own ranks,
    # so Spearman is 0.5 too.
    values = compute_metrics(["pearson", "spearman"], np.array([1.0, 2, 3]), np.array([1.0, 3, 2]))
    assert values["pearson"] == pytest.approx(0.5, abs=1e-12)
    assert values["spearman"] == pytest.approx(0.5, abs=1e-12)
    # Ties: x = 1 2 2 3 has ranks 1 2.5 2.5 4, y = 1 2 3 4 ranks 1 2 3 4; deviations from 2.5:
    # (-1.5, 0, 0, 1.5) and (-1.5, -0.5, 0.5, 1.5); covariance sum = 4.5; sums of squares
    # 4.5 and 5 -> rho = 4.5 / sqrt(22.5) = 3 / sqrt(10) = 0.9486832980...
    # Pearson of the raw y = 1 2 3 4 vs x = 10 20 20 1000 differs; x's ranks are the same.
    rho = compute_metrics(["spearman"], np.array([1.0, 2, 2, 3]), np.array([1.0, 2, 3, 4]))
    assert rho["spearman"] == pytest.approx(3 / math.sqrt(10), abs=1e-12)
    skewed = compute_metrics(["pearson", "spearman"], np.array([10.0, 20, 20, 1000]),
                             np.array([1.0, 2, 3, 4]))
    assert skewed["spearman"] == pytest.approx(3 / math.sqrt(10), abs=1e-12)
    assert skewed["pearson"] == pytest.approx(
        ref_pearson([10, 20, 20, 1000], [1, 2, 3, 4]), abs=1e-12)
    assert skewed["pearson"] < 0.8


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_constant_prediction_correlation_is_zero():
    """Documented: a constant prediction has no defined correlation; it is reported as 0.0."""
    gold = np.array([0.5, 1.0, 4.0, 2.5])
    constant = np.full(4, 2.0, dtype=np.float32)
    values = compute_metrics(["pearson", "spearman"], constant, gold)
    assert values == {"pearson": 0.0, "spearman": 0.0}
    assert not any(math.isnan(v) for v in values.values())


def test_results_are_plain_floats_in_requested_order():
    values = compute_metrics(["f1", "accuracy"], PRED_BINARY, GOLD_BINARY)
    assert list(values) == ["f1", "accuracy"]
    assert all(type(v) is float for v in values.values())


# --- Metric names ---------------------------------------------------------------------------


def test_unknown_metric_names_task_metrics():
    with pytest.raises(BertkitError) as err:
        compute_metrics(["accuracy", "spearmanr"], np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    message = str(err.value)
    assert "task.metrics" in message and "'spearmanr'" in message
    assert "spearman" in message  # lists the known names
    with pytest.raises(BertkitError, match="task.metrics"):
        check_metric_names(["bleu"])
    check_metric_names(list(METRICS))


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_task_configs_name_known_metrics(task):
    config = compose_config(["recipe=glue", f"task={task}", "logger=none"]).task
    check_metric_names(list(config.metrics))
    assert config.main_metric in config.metrics


# --- predictions_from_logits ----------------------------------------------------------------


def test_predictions_from_logits_argmax():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5], [-1.0, -2.0, -0.5], [0.0, 0.1, 0.2]])
    predictions = predictions_from_logits(logits, regression=False)
    assert predictions.tolist() == [1, 0, 2, 2]
    assert predictions.shape == (4,)


def test_predictions_from_logits_binary():
    logits = np.array([[0.3, -0.3], [-2.0, 2.0]], dtype=np.float32)
    assert predictions_from_logits(logits, regression=False).tolist() == [0, 1]


def test_predictions_from_logits_regression():
    logits = np.array([[4.25], [0.5], [-0.75]], dtype=np.float32)
    predictions = predictions_from_logits(logits, regression=True)
    assert predictions.shape == (3,)
    assert predictions.tolist() == [4.25, 0.5, -0.75]


def test_logits_to_metrics_end_to_end():
    """Logits -> predictions -> metrics, as the Trainer's compute_metrics hook does."""
    logits = np.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.2, 0.1]])
    gold = np.array([0, 1, 1, 0])
    values = compute_metrics(["accuracy", "f1"],
                             predictions_from_logits(logits, regression=False), gold)
    # predictions 0 1 0 0: accuracy 3/4; tp=1, fn=1, fp=0 -> F1 = 2/3.
    assert values == pytest.approx({"accuracy": 0.75, "f1": 2 / 3}, abs=1e-12)

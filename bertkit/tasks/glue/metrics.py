"""The GLUE paper's metrics, computed offline with scikit-learn and scipy.

Why not `evaluate.load("glue", ...)`: it fetches its script from the Hub, which fails offline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from bertkit.errors import BertkitError

Metric = Callable[[np.ndarray, np.ndarray], float]

METRICS: dict[str, Metric] = {
    "accuracy": lambda pred, gold: accuracy_score(gold, pred),
    # Binary F1 of the positive class (label id 1), as GLUE reports it for MRPC and QQP.
    "f1": lambda pred, gold: f1_score(gold, pred, pos_label=1, average="binary", zero_division=0),
    "matthews_correlation": lambda pred, gold: matthews_corrcoef(gold, pred),
    "pearson": lambda pred, gold: pearsonr(pred, gold)[0],
    "spearman": lambda pred, gold: spearmanr(pred, gold)[0],
}


def check_metric_names(names: Sequence[str]) -> None:
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise BertkitError(
            f"task.metrics: unknown metric(s) {unknown}; expected some of {sorted(METRICS)}"
        )


def predictions_from_logits(logits: np.ndarray, regression: bool) -> np.ndarray:
    return logits.reshape(-1) if regression else logits.argmax(axis=-1)


def compute_metrics(names: Sequence[str], predictions: np.ndarray, labels: np.ndarray) -> dict:
    """Metric name -> value; correlations of a constant prediction are reported as 0, not NaN."""
    check_metric_names(names)
    results = {}
    for name in names:
        value = float(METRICS[name](predictions, labels))
        results[name] = 0.0 if np.isnan(value) else value
    return results

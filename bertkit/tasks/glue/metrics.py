"""The metrics a GLUE-like task names in task.metrics: the paper's, computed offline with
scikit-learn and scipy, or any `evaluate` module by Hub name or local path.

    metrics: [accuracy, f1]                                 # built in
    metrics: [accuracy, {evaluate: ./my_metric.py}]         # a local evaluate module
    metrics: [{evaluate: glue, config_name: mrpc}]          # a Hub module (needs network)

Why the built-ins stay: `evaluate.load("glue", ...)` fetches its script from the Hub, which
fails offline; an evaluate module's keys are used as it returns them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from bertkit.errors import BertkitError

Metric = Callable[[np.ndarray, np.ndarray], float]
TaskMetrics = Callable[[np.ndarray, np.ndarray], dict]

METRICS: dict[str, Metric] = {
    "accuracy": lambda pred, gold: accuracy_score(gold, pred),
    # Binary F1 of the positive class (label id 1), as GLUE reports it for MRPC and QQP.
    "f1": lambda pred, gold: f1_score(gold, pred, pos_label=1, average="binary", zero_division=0),
    "matthews_correlation": lambda pred, gold: matthews_corrcoef(gold, pred),
    "pearson": lambda pred, gold: pearsonr(pred, gold)[0],
    "spearman": lambda pred, gold: spearmanr(pred, gold)[0],
}
EVALUATE_KEYS = {"evaluate", "config_name", "kwargs"}


def check_metric_names(names: Sequence[str]) -> None:
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise BertkitError(
            f"task.metrics: unknown metric(s) {unknown}; expected some of {sorted(METRICS)}, "
            f"or {{evaluate: <Hub name or path of an evaluate module>}}"
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


def _evaluate_module(entry: dict, position: int) -> TaskMetrics:
    """An `evaluate` module loaded once; any loading failure is one message naming the entry."""
    unknown = set(entry) - EVALUATE_KEYS
    if unknown or not isinstance(entry.get("evaluate"), str):
        raise BertkitError(f"task.metrics[{position}]={entry}: expected {{evaluate: <Hub name "
                           f"or path>}} with optional config_name and kwargs")
    import evaluate

    try:
        module = evaluate.load(entry["evaluate"], entry.get("config_name"))
    except Exception as err:  # offline Hub, a bad path, a broken script: one message
        raise BertkitError(f"task.metrics[{position}]: could not load the evaluate module "
                           f"{entry['evaluate']!r} ({type(err).__name__}: {err}). Offline, "
                           f"give a local path or a built-in: {sorted(METRICS)}") from None
    kwargs = entry.get("kwargs") or {}

    def compute(predictions: np.ndarray, labels: np.ndarray) -> dict:
        scores = module.compute(predictions=predictions.tolist(), references=labels.tolist(),
                                **kwargs)
        return {name: float(value) for name, value in scores.items()}

    return compute


def task_metrics(task: DictConfig) -> TaskMetrics:
    """task.metrics as one function (predictions, gold) -> {metric: value}; checked and
    loaded on the first call (the family's check, before any data is read), then reused."""
    return _task_metrics(json.dumps(OmegaConf.to_container(task.metrics, resolve=True)))


@functools.lru_cache(maxsize=8)
def _task_metrics(metrics_json: str) -> TaskMetrics:
    entries = json.loads(metrics_json)
    check_metric_names([e for e in entries if not isinstance(e, dict)])
    modules = [_evaluate_module(e, i) for i, e in enumerate(entries) if isinstance(e, dict)]
    names = [e for e in entries if not isinstance(e, dict)]

    def compute(predictions: np.ndarray, labels: np.ndarray) -> dict:
        results = compute_metrics(names, predictions, labels)
        for module in modules:
            results.update(module(predictions, labels))
        return results

    return compute

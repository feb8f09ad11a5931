"""Dev prediction files and GLUE leaderboard submission files (`index<TAB>prediction`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertkit.data.atomic_files import write_tsv_atomic


def label_names(predictions: np.ndarray, labels: Sequence[str] | None) -> list[str]:
    """Class ids become the task's label names; regression scores are written as numbers."""
    if labels is None:
        # The shortest text that reads back as the same float32 the model produced.
        return [str(np.float32(score)) for score in predictions]
    return [labels[int(i)] for i in predictions]


def write_dev_predictions(path: Path, idx: Sequence[int], gold: np.ndarray,
                          predictions: np.ndarray, labels: Sequence[str] | None) -> Path:
    rows = zip(idx, label_names(gold, labels), label_names(predictions, labels), strict=True)
    return write_tsv_atomic(path, ["index", "label", "prediction"], rows)


def write_leaderboard_file(path: Path, idx: Sequence[int], predictions: np.ndarray,
                           labels: Sequence[str] | None) -> Path:
    rows = zip(idx, label_names(predictions, labels), strict=True)
    return write_tsv_atomic(path, ["index", "prediction"], rows)

"""SWAG accuracy and prediction files, from the multiple-choice logits alone.

Accuracy is computed here from the argmax of the logits and the gold labels of the data, not
taken from Trainer, so that the number in metrics.json is the one the prediction file gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertkit.data.atomic_files import write_tsv_atomic
from bertkit.errors import BertkitError
from bertkit.tasks.swag.files import NUM_CHOICES

PREDICTION_COLUMNS = ("index", "video-id", "fold-ind", "label", "prediction",
                      *(f"prob{k}" for k in range(NUM_CHOICES)))


def choice_logits(predictions) -> np.ndarray:
    """(examples, choices) logits from Trainer's predictions (a tuple when the model returns
    extra outputs after the logits)."""
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise BertkitError(f"expected (examples, choices) logits, got shape {logits.shape}")
    return logits


def choice_probabilities(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def accuracy(logits: np.ndarray, labels: Sequence[int]) -> dict:
    """accuracy, correct and examples; the first choice wins a tie (numpy's argmax)."""
    labels = np.asarray(labels)
    if len(labels) != len(logits):
        raise BertkitError(f"{len(logits)} predictions for {len(labels)} examples")
    correct = int((logits.argmax(axis=-1) == labels).sum())
    return {"accuracy": correct / len(labels) if len(labels) else 0.0,
            "correct": correct, "examples": len(labels)}


def write_predictions(path: Path, examples, logits: np.ndarray) -> Path:
    """One row per example in data order: index (its position in the split), video-id,
    fold-ind, gold label, predicted label and the four choice probabilities."""
    probabilities = choice_probabilities(logits)
    predicted = logits.argmax(axis=-1)
    rows = (
        [idx, video, fold, int(gold), int(prediction),
         *(str(np.float32(p)) for p in probs)]
        for idx, video, fold, gold, prediction, probs in zip(
            examples["idx"][:], examples["video_id"][:], examples["fold_ind"][:],
            examples["label"][:], predicted, probabilities, strict=True)
    )
    return write_tsv_atomic(path, PREDICTION_COLUMNS, rows)

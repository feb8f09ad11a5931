"""SWAG accuracy and the prediction file (bertkit.tasks.swag.metrics) against independent
computations on fixed logits."""

from __future__ import annotations

import csv
import math

import datasets
import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.swag.metrics import (
    PREDICTION_COLUMNS,
    accuracy,
    choice_logits,
    choice_probabilities,
    write_predictions,
)

# Rows 0, 2 and 4 pick their gold choice; row 3 ties choices 1 and 2 (the first wins).
LOGITS = np.array([
    [2.0, -1.0, 0.5, 0.0],
    [0.1, 0.2, 0.3, 0.4],
    [-3.0, -2.0, -1.0, -0.5],
    [0.0, 1.5, 1.5, -1.0],
    [1e-3, 0.0, 0.0, 2e-3],
])
GOLD = [0, 1, 3, 2, 3]


def by_hand(logits, gold) -> float:
    hits = 0
    for row, label in zip(logits.tolist(), gold, strict=True):
        best = 0
        for k in range(1, len(row)):
            if row[k] > row[best]:
                best = k
        hits += best == label
    return hits / len(gold)


def test_accuracy_is_the_argmax_of_the_logits_against_gold():
    scores = accuracy(LOGITS, GOLD)
    assert scores == {"accuracy": 3 / 5, "correct": 3, "examples": 5}
    assert scores["accuracy"] == by_hand(LOGITS, GOLD)
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=(37, 4))
        gold = rng.integers(0, 4, size=37).tolist()
        assert accuracy(logits, gold)["accuracy"] == pytest.approx(by_hand(logits, gold))
    with pytest.raises(BertkitError, match="5 predictions for 4 examples"):
        accuracy(LOGITS, GOLD[:4])


def test_logits_come_out_of_trainer_predictions():
    assert choice_logits((LOGITS.astype(np.float32), np.zeros(3))).shape == (5, 4)
    assert choice_logits(LOGITS).dtype == np.float64
    with pytest.raises(BertkitError, match=r"expected \(examples, choices\) logits"):
        choice_logits(LOGITS.reshape(-1))


def test_probabilities_are_the_softmax_of_each_row():
    probabilities = choice_probabilities(LOGITS)
    for row, probs in zip(LOGITS.tolist(), probabilities, strict=True):
        total = sum(math.exp(x) for x in row)
        assert probs.tolist() == pytest.approx([math.exp(x) / total for x in row])
    assert choice_probabilities(np.array([[1000.0, 0.0, 0.0, 0.0]]))[0, 0] == 1.0  # no overflow


def test_prediction_file_has_one_row_per_example_in_order(tmp_path):
    examples = datasets.Dataset.from_dict({
        "idx": list(range(5)), "video_id": [f"v{i}" for i in range(5)],
        "fold_ind": [str(100 + i) for i in range(5)], "label": GOLD})
    path = write_predictions(tmp_path / "predictions" / "validation.tsv", examples, LOGITS)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert list(rows[0]) == list(PREDICTION_COLUMNS)
    assert [r["index"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r["fold-ind"] for r in rows] == ["100", "101", "102", "103", "104"]
    assert [int(r["label"]) for r in rows] == GOLD
    assert [int(r["prediction"]) for r in rows] == [0, 3, 3, 1, 3]
    expected = choice_probabilities(LOGITS)
    for row, probs in zip(rows, expected, strict=True):
        assert [float(row[f"prob{k}"]) for k in range(4)] == pytest.approx(probs.tolist(),
                                                                           rel=1e-6)
    rescored = sum(r["label"] == r["prediction"] for r in rows) / len(rows)
    assert rescored == accuracy(LOGITS, GOLD)["accuracy"]
    assert not list(path.parent.glob(".*.tmp"))  # written atomically, nothing left behind

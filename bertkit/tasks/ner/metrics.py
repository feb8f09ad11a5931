"""Entity-level precision, recall and F1 of the CoNLL-2003 shared task, with seqeval, offline.

seqeval's default mode follows conlleval: an entity is a maximal run of B-X/I-X tags of one
type, and an I-X after O or after another type starts a new entity (the model may predict
such sequences). An entity counts as correct when its type and both boundaries match.

The prediction file has one `token gold predicted` line per word and a blank line between
sentences: conlleval, or seqeval on the two tag columns, gives the numbers of metrics.json
from it (conlleval prints them as percentages).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path

from bertkit.data.atomic_files import write_text_atomic

MICRO = ("precision", "recall", "f1")


def entity_types(labels: Sequence[str]) -> list[str]:
    """The entity types of an IOB2 label list, in its order (PER, ORG, LOC, MISC)."""
    return list(dict.fromkeys(label[2:] for label in labels if label != "O"))


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
                  types: Sequence[str] = ()) -> dict[str, float]:
    """Micro precision/recall/F1 over all entities, word accuracy, the gold entity count
    (entities), and per type X: precision_X, recall_X, f1_X, support_X (gold entities of X).
    Every type of `types` is reported, with zeros when it occurs nowhere."""
    from seqeval.metrics import accuracy_score, classification_report

    if len(gold) != len(predicted) or any(len(g) != len(p)
                                          for g, p in zip(gold, predicted, strict=True)):
        raise ValueError("gold and predicted tags differ in sentences or words")
    gold, predicted = [list(s) for s in gold], [list(s) for s in predicted]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns when a type has no entities
        report = classification_report(gold, predicted, output_dict=True, zero_division=0)
        accuracy = accuracy_score(gold, predicted)
    micro = report.pop("micro avg")
    for average in ("macro avg", "weighted avg"):
        report.pop(average, None)
    scores = {name: float(micro[f"{name}-score" if name == "f1" else name]) for name in MICRO}
    scores["accuracy"] = float(accuracy)
    scores["entities"] = int(micro["support"])
    for name in [*types, *sorted(set(report) - set(types))]:
        values = report.get(name, {})
        for metric in MICRO:
            scores[f"{metric}_{name}"] = float(values.get(f"{metric}-score" if metric == "f1"
                                                          else metric, 0.0))
        scores[f"support_{name}"] = int(values.get("support", 0))
    return scores


def _field(token: str) -> str:
    # A token never holds white space in CoNLL files; a Hub token might, and would shift the
    # columns of its line.
    return re.sub(r"\s", "_", token) or "_"


def write_conll_predictions(path: str | Path, tokens: Sequence[Sequence[str]],
                            gold: Sequence[Sequence[str]],
                            predicted: Sequence[Sequence[str]]) -> Path:
    """`token gold predicted` per word, a blank line after every sentence (conlleval's input)."""
    lines = []
    for words, gold_tags, predicted_tags in zip(tokens, gold, predicted, strict=True):
        for word, g, p in zip(words, gold_tags, predicted_tags, strict=True):
            lines.append(f"{_field(word)} {g} {p}\n")
        lines.append("\n")
    return write_text_atomic(path, "".join(lines))

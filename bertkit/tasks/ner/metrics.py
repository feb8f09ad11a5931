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

import datasets
import torch
from transformers.trainer_utils import EvalLoopOutput

from bertkit.data.atomic_files import write_text_atomic
from bertkit.tasks.ner.features import word_predictions

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


# -- scoring a trainer's evaluation -----------------------------------------------------------

def argmax_tags(logits, labels) -> torch.Tensor:
    """Trainer's preprocess_logits_for_metrics: evaluation memory at one id per token instead
    of a logit per label."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


class EntityScorer:
    """BertkitTrainer's scorer for NER: entities scored word by word, as the CoNLL evaluation
    does. Trainer's compute_metrics sees token predictions only, but a word's tag is its first
    sub-token's prediction, a long sentence may span several features, and a word without
    sub-tokens has none: scoring needs each evaluation dataset's word positions. Through the
    trainer, seqeval's entity scores are eval_* metrics that checkpoint selection
    (metric_for_best_model: f1), early stopping and loggers see."""

    def __init__(self, tag_names: Sequence[str]):
        """tag_names: label id -> tag (task.labels)."""
        self.tag_names = list(tag_names)
        self.types = entity_types(tag_names)

    def tags(self, output: EvalLoopOutput, dataset: datasets.Dataset
             ) -> tuple[list[list[str]], list[list[str]]]:
        """(gold tags, predicted tags) per sentence and word of a feature dataset."""
        gold, predicted = word_predictions(dataset, output.predictions,
                                           self.tag_names.index("O"))
        names = self.tag_names
        return [[names[i] for i in s] for s in gold], [[names[i] for i in s] for s in predicted]

    def __call__(self, output: EvalLoopOutput, dataset: datasets.Dataset) -> dict[str, float]:
        return entity_scores(*self.tags(output, dataset), self.types)


def predict_tags(trainer, dataset: datasets.Dataset, metric_key_prefix: str = "eval",
                 ignore_keys=None) -> tuple[list[list[str]], list[list[str]], dict[str, float]]:
    """(gold tags, predicted tags, the evaluation loop's metrics: loss) of a dataset, by a
    trainer whose scorer is an EntityScorer."""
    output = trainer.predict_loop(dataset, metric_key_prefix, ignore_keys)
    return (*trainer.scorer.tags(output, dataset), output.metrics)

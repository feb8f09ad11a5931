"""Trainer whose evaluation scores entities word by word, as the CoNLL evaluation does.

Why: Trainer's compute_metrics sees token predictions only, but a word's tag is its first
sub-token's prediction, a long sentence may span several features, and a word without
sub-tokens has none: scoring needs each evaluation dataset's word positions. Through
ScoringTrainer, seqeval's entity scores are eval_* metrics that checkpoint selection
(metric_for_best_model: f1), early stopping and loggers see.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import torch
from transformers.trainer_utils import EvalLoopOutput

from bertkit.tasks.ner.features import word_predictions
from bertkit.tasks.ner.metrics import entity_scores, entity_types
from bertkit.training.trainer import ScoringTrainer


def _argmax(logits, labels) -> torch.Tensor:
    """Keeps evaluation memory at one id per token instead of a logit per label."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


class TokenClassificationTrainer(ScoringTrainer):
    def __init__(self, *args, tag_names: Sequence[str], **kwargs):
        """tag_names: label id -> tag (task.labels)."""
        super().__init__(*args, preprocess_logits_for_metrics=_argmax, **kwargs)
        self.tag_names = list(tag_names)
        self.types = entity_types(tag_names)

    def tags(self, output: EvalLoopOutput, dataset: datasets.Dataset
             ) -> tuple[list[list[str]], list[list[str]]]:
        """(gold tags, predicted tags) per sentence and word of a feature dataset."""
        gold, predicted = word_predictions(dataset, output.predictions,
                                           self.tag_names.index("O"))
        names = self.tag_names
        return [[names[i] for i in s] for s in gold], [[names[i] for i in s] for s in predicted]

    def predict_tags(self, dataset: datasets.Dataset, metric_key_prefix: str = "eval",
                     ignore_keys=None
                     ) -> tuple[list[list[str]], list[list[str]], dict[str, float]]:
        """(gold tags, predicted tags, the evaluation loop's metrics: loss) of a dataset."""
        output = self.predict_loop(dataset, metric_key_prefix, ignore_keys)
        return (*self.tags(output, dataset), output.metrics)

    def score(self, output: EvalLoopOutput, dataset: datasets.Dataset) -> dict[str, float]:
        return entity_scores(*self.tags(output, dataset), self.types)

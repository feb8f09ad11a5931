"""Trainer whose evaluation scores entities word by word, as the CoNLL evaluation does.

Why a subclass: Trainer's compute_metrics sees token predictions only, but a word's tag is
its first sub-token's prediction, a long sentence may span several features, and a word
without sub-tokens has none: scoring needs each evaluation dataset's word positions. Here
evaluate() maps predictions back to words and returns seqeval's entity scores as eval_*
metrics, so checkpoint selection (metric_for_best_model: f1), early stopping and loggers see
the numbers metrics.json reports.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import datasets
import torch

from bertkit.tasks.ner.features import word_predictions
from bertkit.tasks.ner.metrics import entity_scores, entity_types
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer


def _argmax(logits, labels) -> torch.Tensor:
    """Keeps evaluation memory at one id per token instead of a logit per label."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


class TokenClassificationTrainer(LengthGroupedTrainer):
    def __init__(self, *args, tag_names: Sequence[str], **kwargs):
        """tag_names: label id -> tag (task.labels)."""
        super().__init__(*args, preprocess_logits_for_metrics=_argmax, **kwargs)
        self.tag_names = list(tag_names)
        self.types = entity_types(tag_names)

    def predict_tags(self, dataset: datasets.Dataset, metric_key_prefix: str = "eval",
                     ignore_keys=None
                     ) -> tuple[list[list[str]], list[list[str]], dict[str, float]]:
        """(gold tags, predicted tags) per sentence and word of a feature dataset
        (bertkit.tasks.ner.features), and the evaluation loop's metrics (loss)."""
        dataloader = self.get_eval_dataloader(dataset)
        output = self.evaluation_loop(dataloader, description="Evaluation",
                                      prediction_loss_only=False, ignore_keys=ignore_keys,
                                      metric_key_prefix=metric_key_prefix)
        gold, predicted = word_predictions(dataset, output.predictions,
                                           self.tag_names.index("O"))
        names = self.tag_names
        return ([[names[i] for i in s] for s in gold], [[names[i] for i in s] for s in predicted],
                output.metrics)

    def evaluate(self, eval_dataset=None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, table in dataset.items():
                metrics.update(self.evaluate(table, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        started = time.perf_counter()
        gold, predicted, loop_metrics = self.predict_tags(dataset, metric_key_prefix,
                                                          ignore_keys)
        scores = entity_scores(gold, predicted, self.types)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(loop_metrics)
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - started
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control,
                                                         metrics)
        return metrics

"""Trainer whose evaluation scores whole examples rather than batches of model outputs.

Why a subclass: Trainer's compute_metrics sees one prediction per model input, but a SQuAD
answer comes from all the windows of a question, cut from the passage text, and an NER tag is
a word's, from its first sub-token, across the features of a long sentence. Here evaluate()
runs Trainer's own evaluation loop, hands its predictions to the family's `score` with the
evaluated dataset, and returns the scores as eval_* metrics, so that checkpoint selection
(metric_for_best_model), early stopping and loggers see the numbers metrics.json reports.
A dict of evaluation datasets is scored one by one, with the split in the metric names.
"""

from __future__ import annotations

import time

import datasets
from transformers.trainer_utils import EvalLoopOutput

from bertkit.training.length_grouped_trainer import LengthGroupedTrainer


class ScoringTrainer(LengthGroupedTrainer):
    def score(self, output: EvalLoopOutput, dataset: datasets.Dataset) -> dict[str, float]:
        """{metric: value} of the evaluation loop's predictions on `dataset`."""
        raise NotImplementedError

    def predict_loop(self, dataset: datasets.Dataset, metric_key_prefix: str = "eval",
                     ignore_keys=None) -> EvalLoopOutput:
        dataloader = self.get_eval_dataloader(dataset)
        return self.evaluation_loop(dataloader, description="Evaluation",
                                    prediction_loss_only=False, ignore_keys=ignore_keys,
                                    metric_key_prefix=metric_key_prefix)

    def evaluate(self, eval_dataset=None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, table in dataset.items():
                metrics.update(self.evaluate(table, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        started = time.perf_counter()
        output = self.predict_loop(dataset, metric_key_prefix, ignore_keys)
        scoring = time.perf_counter()
        scores = self.score(output, dataset)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(output.metrics)
        metrics[f"{metric_key_prefix}_scoring_seconds"] = time.perf_counter() - scoring
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - started
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control,
                                                         metrics)
        return metrics

"""Trainer whose evaluation decodes answers and scores them with the official SQuAD metrics.

Why a subclass: Trainer computes metrics from each window's logits, but a SQuAD answer comes
from all the windows of a question together, cut from the passage text; and without labels
the QA model returns no loss, so Hugging Face's run_qa.py cannot choose checkpoints by F1
(metric_for_best_model). Here evaluate() returns the official scores as eval_* metrics, so
checkpoint selection, early stopping and loggers see them like any other metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bertkit.training.length_grouped_trainer import LengthGroupedTrainer

# (start logits, end logits) of every evaluation window -> (metrics, decoded answers)
AnswerEvaluator = Callable[[np.ndarray, np.ndarray], tuple[dict, object]]


class QuestionAnsweringTrainer(LengthGroupedTrainer):
    def __init__(self, *args, evaluate_answers: AnswerEvaluator, **kwargs):
        super().__init__(*args, **kwargs)
        self.evaluate_answers = evaluate_answers
        self.last_answers = None  # what the latest evaluate() decoded

    def evaluate(self, eval_dataset=None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        started = time.perf_counter()
        dataloader = self.get_eval_dataloader(eval_dataset)
        output = self.evaluation_loop(dataloader, description="Evaluation",
                                      prediction_loss_only=False, ignore_keys=ignore_keys,
                                      metric_key_prefix=metric_key_prefix)
        start_logits, end_logits = output.predictions[:2]
        decoding = time.perf_counter()
        scores, self.last_answers = self.evaluate_answers(start_logits, end_logits)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(output.metrics)
        metrics[f"{metric_key_prefix}_decode_seconds"] = time.perf_counter() - decoding
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - started
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control,
                                                         metrics)
        return metrics

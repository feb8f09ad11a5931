"""Trainer whose evaluation decodes answers and scores them with the official SQuAD metrics.

Why: a SQuAD answer comes from all the windows of a question together, cut from the passage
text, and without labels the QA model returns no loss, so Hugging Face's run_qa.py cannot
choose checkpoints by F1. Through ScoringTrainer the official scores are eval_* metrics that
checkpoint selection (metric_for_best_model), early stopping and loggers see. The answers of
the latest evaluation stay here, for the final model's prediction files.
"""

from __future__ import annotations

from collections.abc import Callable

import datasets
import numpy as np
from transformers.trainer_utils import EvalLoopOutput

from bertkit.training.trainer import ScoringTrainer

# (start logits, end logits) of every evaluation window -> (metrics, decoded answers)
AnswerEvaluator = Callable[[np.ndarray, np.ndarray], tuple[dict, object]]


class QuestionAnsweringTrainer(ScoringTrainer):
    def __init__(self, *args, evaluate_answers: AnswerEvaluator, **kwargs):
        super().__init__(*args, **kwargs)
        self.evaluate_answers = evaluate_answers
        self.last_answers = None  # what the latest evaluate() decoded

    def score(self, output: EvalLoopOutput, dataset: datasets.Dataset) -> dict[str, float]:
        start_logits, end_logits = output.predictions[:2]
        scores, self.last_answers = self.evaluate_answers(start_logits, end_logits)
        return scores

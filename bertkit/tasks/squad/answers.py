"""The dev set's answers: decoded from the logits of every window, thresholded (v2.0), scored
with the official metrics, and written in the official scripts' file formats.

v2.0 scoring: the answer is "" when null odds (null score - best span score) exceed
task.null_score_diff_threshold. exact/f1/HasAns/NoAns are those of predictions.json;
best_exact/best_f1 sweep the threshold over the best non-null span of every question
(best_span_predictions.json), since a sweep over answers already replaced by "" could never
give them back. `evaluate-v2.0.py dev-v2.0.json predictions.json --na-prob-file
null_odds.json --na-prob-thresh T` (T the threshold, when above 1.0) reproduces the first,
and the same with best_span_predictions.json the second.
"""

from __future__ import annotations

import math
from pathlib import Path

import datasets
from omegaconf import DictConfig
from transformers.trainer_utils import EvalLoopOutput

from bertkit.data.atomic_files import write_json_atomic
from bertkit.tasks.squad.decoding import SquadPredictions, decode_predictions
from bertkit.tasks.squad.metrics import (
    squad_v1_scores,
    squad_v2_scores,
    write_null_odds_json,
    write_predictions_json,
)


def answer_evaluator(task: DictConfig, examples: datasets.Dataset,
                     features: datasets.Dataset):
    """(start, end logits) -> (official scores, SquadPredictions with the final answers)."""
    version_2 = task.version == "v2.0"
    threshold = float(task.null_score_diff_threshold)

    def evaluate(start_logits, end_logits) -> tuple[dict, SquadPredictions]:
        # v2.0: decode every best non-null span (threshold +inf), then apply the threshold.
        decoded = decode_predictions(
            examples, features, start_logits, end_logits, n_best_size=task.n_best_size,
            max_answer_length=task.max_answer_length, version_2=version_2,
            null_score_diff_threshold=math.inf if version_2 else threshold,
            with_nbest=task.write_nbest)
        if not version_2:
            return squad_v1_scores(decoded.predictions, examples), decoded
        spans, odds = decoded.predictions, decoded.null_odds
        final = {qid: "" if odds[qid] > threshold else text for qid, text in spans.items()}
        # Scored on the spans with the threshold: the main scores equal those of `final`,
        # and the best-threshold sweep can still choose any span.
        scores = squad_v2_scores(spans, examples, odds, null_threshold=threshold)
        return scores, SquadPredictions(final, odds, decoded.nbest, spans)

    return evaluate


class AnswerScorer:
    """BertkitTrainer's scorer for SQuAD: the evaluation's (start, end logits) of every window
    decoded into answers and scored with the official metrics (an answer comes from all the
    windows of a question together, cut from the passage text; without labels the QA model
    returns no loss, so Hugging Face's run_qa.py cannot choose checkpoints by F1). The answers
    of the latest evaluation stay here, for the final model's prediction files."""

    def __init__(self, evaluate_answers):
        """evaluate_answers: answer_evaluator's (start, end logits) -> (scores, answers)."""
        self.evaluate_answers = evaluate_answers
        self.last_answers: SquadPredictions | None = None  # what the latest evaluation decoded

    def __call__(self, output: EvalLoopOutput, dataset: datasets.Dataset) -> dict[str, float]:
        start_logits, end_logits = output.predictions[:2]
        scores, self.last_answers = self.evaluate_answers(start_logits, end_logits)
        return scores


def write_answer_files(run_dir: Path, answers: SquadPredictions) -> dict[str, str]:
    """predictions.json, and null_odds.json with best_span_predictions.json (v2.0) and
    nbest_predictions.json (task.write_nbest) when decoded: name -> path."""
    files = {"predictions": write_predictions_json(run_dir / "predictions.json",
                                                   answers.predictions)}
    if answers.null_odds is not None:
        files["null_odds"] = write_null_odds_json(run_dir / "null_odds.json", answers.null_odds)
        files["best_span_predictions"] = write_predictions_json(
            run_dir / "best_span_predictions.json", answers.spans)
    if answers.nbest is not None:
        files["nbest_predictions"] = write_json_atomic(run_dir / "nbest_predictions.json",
                                                       answers.nbest)
    return {name: str(path) for name, path in files.items()}

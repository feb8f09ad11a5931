"""The SQuAD family's steps of the finetuning run: BertForQuestionAnswering on SQuAD v1.1 or
v2.0.

Cuts the splits into windows once (cached), selects checkpoints by the official F1 (the
evaluation decodes answers: bertkit.tasks.squad.answers), and leaves in the run directory,
beside what every finetune writes (bertkit.training.finetune): predictions.json (question id
-> answer, the official scripts' input), for v2.0 null_odds.json (their --na-prob-file) and
best_span_predictions.json, optionally nbest_predictions.json (bertkit.tasks.squad.answers).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from transformers import DataCollatorWithPadding

from bertkit.data.task_data import TaskData
from bertkit.errors import BertkitError
from bertkit.tasks.squad.answers import AnswerScorer, answer_evaluator, write_answer_files
from bertkit.tasks.squad.data import load_squad_splits
from bertkit.tasks.squad.features import DECODING_COLUMNS, check_window_settings, window_splits
from bertkit.tasks.squad.files import VERSIONS
from bertkit.tasks.squad.models import load_question_answerer
from bertkit.training.finetune import Evaluation, TaskFamily
from bertkit.training.trainer import PAST_WINDOW, BertkitTrainer, PaddedRows

# Scores shown in the printout, as many as the version has.
HEADLINE = ("exact_match", "exact", "f1", "best_f1", "best_f1_thresh")


def _check_task(task: DictConfig) -> None:
    if task.version not in VERSIONS:
        raise BertkitError(f"task.version={task.version!r}: expected one of "
                           f"{', '.join(VERSIONS)}")
    check_window_settings(task.max_seq_length, task.doc_stride, task.max_query_length)


def _scores(metrics: dict[str, float]) -> dict[str, float]:
    """The official scores among Trainer's eval_* metrics (without timings and the epoch)."""
    return {name.removeprefix("eval_"): value for name, value in metrics.items()
            if not name.endswith(("_runtime", "_per_second", "_seconds")) and name != "epoch"}


class SquadFamily(TaskFamily):
    name = "squad"
    preparing = "reading the data and cutting windows"

    def check(self, task: DictConfig, model: DictConfig) -> None:
        _check_task(task)

    def second_segment(self, task: DictConfig, data_source: str) -> str:
        return "task.family=squad (a question, then its passage)"

    def read(self, task, data_source):
        return load_squad_splits(task, data_source)

    def featurize(self, task, splits, tokenizer, cache_dir, num_proc) -> TaskData:
        train, evaluation = window_splits(
            splits, tokenizer, max_seq_length=task.max_seq_length, doc_stride=task.doc_stride,
            max_query_length=task.max_query_length, cache_dir=cache_dir,
            num_proc=num_proc)
        return TaskData(splits, {"train": train, "validation": evaluation})

    def build_model(self, task, model, tokenizer, data):
        return load_question_answerer(model, tokenizer)

    def padded_rows(self, task) -> PaddedRows:
        """Start and end positions past the window, which the QA head ignores."""
        return PaddedRows({"start_positions": PAST_WINDOW, "end_positions": PAST_WINDOW})

    def build_trainer(self, task, args, model, tokenizer, data, pad_to_multiple_of):
        evaluation = data.features["validation"]
        return BertkitTrainer(
            model=model, args=args, train_dataset=data.features["train"],
            eval_dataset=evaluation.remove_columns(list(DECODING_COLUMNS)),
            processing_class=tokenizer,
            data_collator=DataCollatorWithPadding(tokenizer,
                                                  pad_to_multiple_of=pad_to_multiple_of),
            scorer=AnswerScorer(answer_evaluator(task, data.splits["validation"],
                                                 evaluation)))

    def hyperparameters(self, task, model) -> dict:
        return {key: task[key] for key in ("doc_stride", "max_query_length", "n_best_size",
                                               "max_answer_length")}

    def train_sizes(self, data) -> dict:
        return {"questions": len(data.splits["train"]), "windows": len(data.features["train"])}

    def evaluate(self, task, trainer, data, run_dir: Path, main: bool) -> Evaluation:
        """The best checkpoint's answers (load_best_model_at_end), decoded once more: their
        scores, and the files of the answers this evaluation decoded."""
        final = trainer.evaluate()
        files = write_answer_files(run_dir, trainer.scorer.last_answers) if main else {}
        return Evaluation(
            validation={"validation": _scores(final)}, files=files,
            details={"version": task.version,
                     "best_checkpoint": trainer.state.best_model_checkpoint,
                     "evaluation": {"questions": len(data.splits["validation"]),
                                    "windows": len(data.features["validation"]),
                                    "decode_seconds": round(final["eval_scoring_seconds"], 3),
                                    "seconds": round(final["eval_runtime"], 2)}})

    def headline(self, summary: dict) -> str:
        scores = summary["validation"]["validation"]
        evaluation = summary["details"]["evaluation"]
        shown = ", ".join(f"{name} {scores[name]:.2f}" for name in scores if name in HEADLINE)
        return (f"{shown}; {evaluation['questions']} questions decoded in "
                f"{evaluation['decode_seconds']:.2f} s")


FAMILY = SquadFamily()

"""The SWAG family's steps of the finetuning run: BertForMultipleChoice, four endings each.

Leaves in the run directory, beside what every finetune writes (bertkit.training.finetune):
predictions/validation.tsv (per example: gold, prediction, the four probabilities). Accuracy
is computed from the logits (bertkit.tasks.swag.metrics), so it is the one the file gives.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    AutoModelForMultipleChoice,
    BertForMultipleChoice,
    DataCollatorForMultipleChoice,
    EvalPrediction,
)

from bertkit.data.task_data import TaskData, TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.swag.data import load_swag_splits
from bertkit.tasks.swag.features import check_max_seq_length, encode_splits
from bertkit.tasks.swag.files import NUM_CHOICES
from bertkit.tasks.swag.metrics import accuracy, choice_logits, write_predictions
from bertkit.training.finetune import Evaluation, TaskFamily
from bertkit.training.models import load_with_head
from bertkit.training.trainer import BertkitTrainer

METRICS = ("accuracy",)


def _metrics_of(prediction: EvalPrediction) -> dict:
    return accuracy(choice_logits(prediction.predictions), prediction.label_ids)


class SwagFamily(TaskFamily):
    name = "swag"
    preparing = "reading the data and encoding the choices"

    def check(self, task, model) -> None:
        check_max_seq_length(task.max_seq_length)
        if task.main_metric not in METRICS:
            raise BertkitError(f"task.main_metric={task.main_metric!r}: SWAG reports "
                               f"{', '.join(METRICS)}")

    def second_segment(self, task, data_source) -> str:
        return "task.family=swag (the context, then an ending)"

    def read(self, task, data_source) -> TaskSplits:
        return load_swag_splits(task, data_source)

    def featurize(self, task, splits, tokenizer, cache_dir, num_proc) -> TaskData:
        return TaskData(splits, encode_splits(splits, tokenizer,
                                              max_seq_length=task.max_seq_length,
                                              cache_dir=cache_dir, num_proc=num_proc))

    def build_model(self, task, model, tokenizer, data):
        return load_with_head(model, tokenizer, AutoModelForMultipleChoice,
                              BertForMultipleChoice, {})

    def build_trainer(self, task, args, model, tokenizer, data, pad_to_multiple_of):
        return BertkitTrainer(
            model=model, args=args, train_dataset=data.features["train"],
            eval_dataset=data.features["validation"], processing_class=tokenizer,
            data_collator=DataCollatorForMultipleChoice(tokenizer,
                                                        pad_to_multiple_of=pad_to_multiple_of),
            compute_metrics=_metrics_of)

    def hyperparameters(self, task, model) -> dict:
        return {"num_choices": NUM_CHOICES}

    def evaluate(self, task, trainer, data, run_dir: Path, main: bool) -> Evaluation:
        features = data.features["validation"]
        output = trainer.predict(features, metric_key_prefix="eval_validation")
        logits = choice_logits(output.predictions)
        # Gold labels from the data, not from Trainer: accuracy is argmax(logits) against them.
        evaluation = Evaluation({"validation": accuracy(logits, features["label"][:])})
        if main:
            path = write_predictions(run_dir / "predictions" / "validation.tsv",
                                     data.splits["validation"], logits)
            evaluation.files["predictions"] = str(path)
        return evaluation

    def headline(self, summary: dict) -> str:
        scores = summary["validation"]["validation"]
        return f"{scores['correct']} of {scores['examples']} validation examples"


FAMILY = SwagFamily()

"""The GLUE family's steps of the finetuning run: sentence(-pair) classification and regression,
with its features (tokenised splits) and its head, one function each, at the end.

Leaves in the run directory, beside what every finetune writes (bertkit.training.finetune):
predictions/<dev split>.tsv and the GLUE leaderboard files of the test splits
(`index<TAB>prediction`), written by the functions at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    EvalPrediction,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bertkit.data.atomic_files import write_tsv_atomic
from bertkit.data.cache import cache_entry, cached_map
from bertkit.data.task_data import TaskData, TaskSplits, uses_local_files
from bertkit.errors import BertkitError
from bertkit.tasks.glue.data import (
    class_names,
    ensure_demo_data,
    file_labels,
    is_test_split,
    is_validation_split,
    load_glue_splits,
)
from bertkit.tasks.glue.metrics import predictions_from_logits, task_metrics
from bertkit.training.finetune import Evaluation, TaskFamily
from bertkit.training.models import load_with_head
from bertkit.training.trainer import BertkitTrainer, PaddedRows, nan_ignoring_mse


def logits_of(output) -> np.ndarray:
    """The classifier's logits (models may return extra outputs after them)."""
    predictions = output.predictions
    return predictions[0] if isinstance(predictions, tuple) else predictions


class GlueFamily(TaskFamily):
    name = "glue"

    def check(self, task: DictConfig, model: DictConfig) -> None:
        task_metrics(task)
        class_names(task)
        entries = list(task.metrics)
        if all(isinstance(entry, str) for entry in entries) \
                and task.main_metric not in entries:
            raise BertkitError(f"task.main_metric={task.main_metric} is not among "
                               f"task.metrics {entries}")

    def second_segment(self, task: DictConfig, data_source: str) -> str | None:
        """A pair task's second column, where the run reads it (local files or the Hub)."""
        keys = (("columns.text_b", "headerless_columns.text_b")
                if uses_local_files(task, data_source) else ("hub.columns.text_b",))
        for key in keys:
            value = OmegaConf.select(task, key)
            if value is not None:
                return f"task.{key}={value}"
        return None

    def generate_data(self, task: DictConfig) -> None:
        """The embedded demo set (task.synthetic), vocab.txt included, before anything reads it."""
        synthetic = OmegaConf.select(task, "synthetic")
        if synthetic is not None and task.data_dir:
            ensure_demo_data(task.data_dir, OmegaConf.to_container(synthetic))

    def read(self, task, data_source) -> TaskSplits:
        return load_glue_splits(task, data_source)

    def featurize(self, task, splits, tokenizer, cache_dir, num_proc) -> TaskData:
        features = tokenize_splits(splits, tokenizer, max_seq_length=task.max_seq_length,
                                   cache_dir=cache_dir, num_proc=num_proc)
        return TaskData(splits, features)

    def build_model(self, task, model, tokenizer, data):
        return load_sequence_classifier(model, tokenizer, class_names(task))

    def padded_rows(self, task) -> PaddedRows:
        """Regression (STS-B): NaN labels, and the head's MSE over the others."""
        if task.labels is None:
            return PaddedRows({"labels": float("nan")}, loss=nan_ignoring_mse)
        return PaddedRows()

    def build_trainer(self, task, args, model, tokenizer, data, pad_to_multiple_of):
        metrics = task_metrics(task)
        regression = task.labels is None

        def metrics_of(prediction: EvalPrediction) -> dict:
            return metrics(predictions_from_logits(logits_of(prediction), regression),
                           prediction.label_ids)

        return BertkitTrainer(
            model=model, args=args, train_dataset=data.features["train"],
            eval_dataset={split: table for split, table in data.features.items()
                          if is_validation_split(split)},
            processing_class=tokenizer,
            data_collator=DataCollatorWithPadding(tokenizer,
                                                  pad_to_multiple_of=pad_to_multiple_of),
            compute_metrics=metrics_of)

    def evaluate(self, task, trainer, data, run_dir: Path, main: bool) -> Evaluation:
        labels = file_labels(task)
        regression, metrics = labels is None, task_metrics(task)
        evaluation = Evaluation(validation={})
        for split, table in data.features.items():
            if is_validation_split(split):
                output = trainer.predict(table, metric_key_prefix=f"eval_{split}")
                predicted = predictions_from_logits(logits_of(output), regression)
                evaluation.validation[split] = metrics(predicted, output.label_ids)
                if main:
                    path = write_dev_predictions(run_dir / "predictions" / f"{split}.tsv",
                                                 table["idx"][:], np.asarray(table["label"][:]),
                                                 predicted, labels)
                    evaluation.files[f"{split}_predictions"] = str(path)
            elif is_test_split(split):
                with trainer.predicting_eagerly():  # once, unlabelled: no graph of its own
                    output = trainer.predict(table, metric_key_prefix=f"test_{split}")
                name = task.leaderboard_files.get(split, f"{task.name.upper()}-{split}.tsv")
                if main:
                    path = write_leaderboard_file(
                        run_dir / "leaderboard" / name, table["idx"][:],
                        predictions_from_logits(logits_of(output), regression), labels)
                    evaluation.files[f"{split}_leaderboard"] = str(path)
        return evaluation


FAMILY = GlueFamily()


# Dev prediction files and GLUE leaderboard submission files (`index<TAB>prediction`).

def label_names(predictions: np.ndarray, labels: Sequence[str] | None) -> list[str]:
    """Class ids become the task's label names; regression scores are written as numbers."""
    if labels is None:
        # The shortest text that reads back as the same float32 the model produced.
        return [str(np.float32(score)) for score in predictions]
    return [labels[int(i)] for i in predictions]


def write_dev_predictions(path: Path, idx: Sequence[int], gold: np.ndarray,
                          predictions: np.ndarray, labels: Sequence[str] | None) -> Path:
    rows = zip(idx, label_names(gold, labels), label_names(predictions, labels), strict=True)
    return write_tsv_atomic(path, ["index", "label", "prediction"], rows)


def write_leaderboard_file(path: Path, idx: Sequence[int], predictions: np.ndarray,
                           labels: Sequence[str] | None) -> Path:
    rows = zip(idx, label_names(predictions, labels), strict=True)
    return write_tsv_atomic(path, ["index", "prediction"], rows)


# ================================================================================================
# BERT with the GLUE head: classification over the task's classes, or one-output regression.

def load_sequence_classifier(
    model: DictConfig, tokenizer: PreTrainedTokenizerBase, class_names: list[str] | None
) -> PreTrainedModel:
    """BERT with a classification head over class_names (task.class_names, which its config's
    id2label/label2id name), or a one-output regression head (class_names None)."""
    head = {"num_labels": 1, "problem_type": "regression"} if class_names is None else {
        "num_labels": len(class_names),
        "problem_type": "single_label_classification",
        "id2label": dict(enumerate(class_names)),
        "label2id": {name: i for i, name in enumerate(class_names)},
    }
    return load_with_head(model, tokenizer, AutoModelForSequenceClassification,
                           BertForSequenceClassification, head)


# ================================================================================================
# Tokenise GLUE splits once per (data, tokenizer, max length), cached for every run.
#
# No padding here: the collator pads each batch to its longest sequence (dynamic padding).

def tokenize_splits(
    splits: TaskSplits,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    cache_dir: str | Path,
    num_proc: int = 1,
) -> dict[str, datasets.Dataset]:
    """Adds input_ids, token_type_ids, attention_mask and `length` (for length grouping)."""
    pair = "text_b" in splits[next(iter(splits))].column_names

    def encode(batch: dict) -> dict:
        encoded = tokenizer(
            batch["text_a"],
            batch["text_b"] if pair else None,
            truncation=True,
            max_length=max_seq_length,
        )
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    entry = cache_entry(cache_dir, "glue", data=splits.fingerprint(), tokenizer=tokenizer,
                        settings={"max_seq_length": max_seq_length})
    return {split: cached_map(table, encode, entry, split, num_proc=num_proc,
                              desc=f"Tokenizing {split}")
            for split, table in splits.items()}

"""What a task family supplies to the one finetune job (bertkit.training.finetune): a
small spec of the steps that differ between families. Everything else (arguments, seed, data
under main_process_first, trainer, train, evaluate, metrics.json, W&B, the printout) is
written once, in finetune.py.

A family subclasses TaskFamily in its own folder (bertkit/tasks/<family>/family.py) and
is named in bertkit.tasks.FAMILIES.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

from bertkit.data.task_data import TaskData, TaskSplits
from bertkit.training.static_shapes import PaddedRows


@dataclass
class Evaluation:
    """The final model's scores and files, in metrics.json's shape (bertkit.data.metrics_file)."""

    validation: dict[str, dict[str, float]]  # dev split -> metric -> value
    test: dict[str, dict[str, float]] = field(default_factory=dict)  # labelled test splits
    files: dict[str, str] = field(default_factory=dict)  # name -> written file
    details: dict = field(default_factory=dict)  # the family's own facts for metrics.json


class TaskFamily:
    """One task family's steps. `name` is task.family; `preparing` says what reading and
    featurizing do (the log line of main_process_first).

    Each step gets the settings it reads, not the whole config: the `task` node first, then
    the `model` node, data_source or the preprocessing keys where it reads them."""

    name: str
    preparing = "reading and tokenizing the data"

    def check(self, task: DictConfig, model: DictConfig) -> None:
        """Settings errors, before any data is read."""

    def second_segment(self, task: DictConfig, data_source: str) -> str | None:
        """The setting that makes this task feed the model a second segment (token type 1:
        a sentence pair, a question and its passage), as `key=value` for messages; None when
        every input is one segment. check_model_settings holds model's token types to it."""
        return None

    def generate_data(self, task: DictConfig) -> None:
        """Write generated data sets (the embedded demo) before the tokenizer or the reader
        looks for their files; a no-op for real data."""

    def read(self, task: DictConfig, data_source: str) -> TaskSplits:
        """The raw splits, from local files or the Hub (bertkit.data.sources). Before the
        tokenizer loads, so that a bad data file is reported before a missing tokenizer."""
        raise NotImplementedError

    def featurize(self, task: DictConfig, splits: TaskSplits,
                  tokenizer: PreTrainedTokenizerBase, cache_dir: str | None,
                  num_proc: int | None) -> TaskData:
        """The model's features of every split (cached under cache_dir: bertkit.data.cache;
        num_proc: preprocessing_num_workers)."""
        raise NotImplementedError

    def build_model(self, task: DictConfig, model: DictConfig,
                    tokenizer: PreTrainedTokenizerBase,
                    data: TaskData) -> PreTrainedModel:
        raise NotImplementedError

    def build_trainer(self, task: DictConfig, args: TrainingArguments, model: PreTrainedModel,
                      tokenizer: PreTrainedTokenizerBase, data: TaskData,
                      pad_to_multiple_of: int | None) -> Trainer:
        raise NotImplementedError

    def padded_rows(self, task: DictConfig) -> PaddedRows:
        """How the rows that fill a short batch up to its batch size weigh nothing (static
        shapes: bertkit.training.static_shapes): by default, labels the loss ignores (-100)."""
        return PaddedRows()

    def hyperparameters(self, task: DictConfig, model: PreTrainedModel) -> dict:
        """The family's settings beyond the paper's, for W&B and metrics.json."""
        return {}

    def train_sizes(self, data: TaskData) -> dict:
        """How much data one epoch is, for metrics.json's train record."""
        return {"examples": len(data.features["train"])}

    def evaluate(self, task: DictConfig, trainer: Trainer, data: TaskData, run_dir: Path,
                 main: bool) -> Evaluation:
        """The final model (the best checkpoint's, with load_best_model_at_end) on the dev and
        labelled test splits; prediction files written by the main process only."""
        raise NotImplementedError

    def save_model(self, trainer: Trainer, run_dir: Path, main: bool) -> None:
        trainer.save_model(str(run_dir / "model"))

    def headline(self, summary: dict) -> str:
        """The scores in the printout after `<task>: <main metric> = <value>`."""
        return "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()
                                                  if isinstance(v, float))
                         for split, scores in {**summary["validation"],
                                               **summary["test"]}.items())

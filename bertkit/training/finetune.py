"""Finetuning any task family through the one run skeleton (bertkit.training.run).

The family (bertkit.training.family) supplies what differs: its data, model head, trainer,
evaluation and files. Written once here: generated data, then the splits, then the tokenizer
and the features (in that order, so that a bad data file is reported before a missing
tokenizer); the paper's hyperparameters; metrics.json in the one schema
(bertkit.data.metrics_file); final/<split>/<metric> in W&B; the printout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from bertkit.data.metrics_file import METRICS_FILE, metrics_record
from bertkit.data.task_data import TaskData
from bertkit.errors import BertkitError
from bertkit.finetuning.toolbox import Toolbox
from bertkit.training.family import Evaluation, FinetuningFamily
from bertkit.training.lifecycle import result_header
from bertkit.training.models import check_sequence_length, load_tokenizer
from bertkit.training.run import Outcome, TrainingJob, run_training
from bertkit.training.wandb_logging import paper_hyperparameters


@dataclass
class _Prepared:
    tokenizer: object
    data: TaskData


def main_value(evaluation: Evaluation, main_metric: str) -> float:
    """The main metric on the first dev split (MNLI: matched), the value runs are ranked by."""
    split, scores = next(iter(evaluation.validation.items()))
    if main_metric not in scores:
        raise BertkitError(f"task.main_metric={main_metric} is not among the scores of the "
                           f"{split} split: {', '.join(scores)}")
    return scores[main_metric]


class FinetuneJob(TrainingJob):
    def __init__(self, family: FinetuningFamily, details: dict | None = None):
        self.family = family
        self.preparing = family.preparing
        self.details = details or {}  # facts of the run's context (two-stage: the first stage)
        self.toolbox: Toolbox | None = None

    def check(self, cfg):
        self.toolbox = Toolbox(cfg.finetuning)  # checks the finetuning.* keys
        self.family.check(cfg)

    def prepare_data(self, cfg, args) -> _Prepared:
        self.family.generate_data(cfg)
        splits = self.family.read(cfg)
        tokenizer = load_tokenizer(cfg.model)
        check_sequence_length(cfg.model, cfg.task.max_seq_length, "task.max_seq_length")
        return _Prepared(tokenizer, self.family.featurize(cfg, splits, tokenizer))

    def build_trainer(self, cfg, args, prepared, pad_to_multiple_of):
        model = self.family.build_model(cfg, prepared.tokenizer, prepared.data)
        hyperparameters = {**paper_hyperparameters(args, model, cfg.task.max_seq_length),
                           **self.family.hyperparameters(cfg, model),
                           **self.toolbox.hyperparameters()}
        model = self.toolbox.apply(model)
        trainer = self.family.build_trainer(cfg, args, model, prepared.tokenizer,
                                            prepared.data, pad_to_multiple_of)
        self.toolbox.attach(trainer)
        return trainer, hyperparameters

    def outcome(self, cfg, trainer, prepared, run, run_dir: Path, hyperparameters) -> Outcome:
        family, data = self.family, prepared.data
        self.toolbox.finish(trainer, run_dir, run.main)
        evaluation = family.evaluate(cfg, trainer, data, run_dir, run.main)
        family.save_model(trainer, run_dir, run.main)
        record = metrics_record(
            header=result_header(cfg, family.name, trainer.args.seed,
                                 main_value(evaluation, cfg.task.main_metric)),
            validation=evaluation.validation, test=evaluation.test,
            train=run.train_record(**family.train_sizes(data)),
            hyperparameters=hyperparameters, files=evaluation.files,
            details={**data.facts, **evaluation.details, **self.details,
                     **({"finetuning": facts} if (facts := self.toolbox.record()) else {})})
        final = {f"{split}/{metric}": value
                 for split, scores in {**evaluation.validation, **evaluation.test}.items()
                 for metric, value in scores.items()}
        final.update(self.toolbox.summary())  # the mix's learned weights, LoRA's share, ...

        def printout(where: str) -> str:
            width = max(len(name) + 1 for name in ["checkpoint", *evaluation.files])
            files = "".join(f"\n  {name + ':':<{width}} {path}"
                            for name, path in evaluation.files.items())
            return (f"\n{cfg.task.name}: {cfg.task.main_metric} = {record['main_value']:.4f} "
                    f"({family.headline(record)})\n"
                    f"  {'metrics:':<{width}} {run_dir / METRICS_FILE}{files}\n"
                    f"  {'model:':<{width}} {run_dir / 'model'}\n"
                    f"  {'checkpoint:':<{width}} {trainer.args.output_dir}\n"
                    f"  {where}")

        return Outcome(record, final, (record["main_metric"], record["main_value"]), printout)


def finetune(cfg: DictConfig, family: FinetuningFamily, run_dir: Path | None = None,
             details: dict | None = None) -> dict:
    """Finetunes cfg.task with `family`; returns the metrics.json record (`details`: added to
    its details)."""
    return run_training(cfg, FinetuneJob(family, details), run_dir)

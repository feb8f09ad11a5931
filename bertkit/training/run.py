"""The one run skeleton every training job goes through, finetunes and pretraining alike.

    check -> TrainingArguments -> seed -> data (under main_process_first) -> trainer (its
    training clock, the job's callbacks) -> train (lifecycle: early stopping, train_fraction,
    time budget, resume, W&B) -> outcome (evaluate, save the model) -> metrics.json, the
    model's card (model/README.md), W&B summary, printout (main process) -> after -> the Hub
    push (trainer.push_to_hub=true)

A job (TrainingJob) supplies the steps: bertkit.training.finetune adapts any task family to
it, bertkit.pretraining.run is the pretraining job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import Trainer, TrainingArguments, set_seed

from bertkit.data.atomic_files import write_json_atomic
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.training.arguments import build_training_arguments
from bertkit.training.budget import ClockCallback, budget_hyperparameters, budget_settings
from bertkit.training.clock import TrainingClock
from bertkit.training.lifecycle import (
    TrainingRun,
    finish_wandb,
    report_to,
    resume_checkpoint,
    train,
)
from bertkit.training.model_card import check_hub_settings, push_model, run_card, write_card


@dataclass
class Outcome:
    """What a trained job reports: metrics.json's record, the final scores for W&B's summary
    (final/<key>), its headline (main metric, value) if it has one, and the printout (given
    the line saying where the W&B run went)."""

    record: dict
    final: dict[str, float]
    headline: tuple[str, float] | None
    printout: Callable[[str], str]


class TrainingJob:
    preparing = "preparing the data"

    def check(self, cfg: DictConfig) -> None:
        """Settings errors, before any data is read."""

    def prepare_data(self, cfg: DictConfig, args: TrainingArguments) -> Any:
        """The job's data (and tokenizer), built once per process group."""
        raise NotImplementedError

    def build_trainer(self, cfg: DictConfig, args: TrainingArguments, data: Any,
                      pad_to_multiple_of: int | None) -> tuple[Trainer, dict]:
        """(the Trainer, the hyperparameters recorded in W&B and metrics.json)."""
        raise NotImplementedError

    def callbacks(self, cfg: DictConfig, trainer: Trainer, data: Any,
                  clock: TrainingClock) -> list:
        """The job's own Trainer callbacks, given the run's training clock (which they may
        read, or pause while they measure)."""
        return []

    def outcome(self, cfg: DictConfig, trainer: Trainer, data: Any, run: TrainingRun,
                run_dir: Path, hyperparameters: dict) -> Outcome:
        """Evaluate the final model and save it; files are written by the main process."""
        raise NotImplementedError

    def after(self, cfg: DictConfig, record: dict, run_dir: Path, main: bool) -> dict:
        """What runs once the job's own W&B run is closed (pretraining: downstream finetunes)."""
        return record


def hydra_run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def training_clock() -> TrainingClock:
    """The run's training clock (a function: tests hand in one with a fake time)."""
    return TrainingClock()


def run_training(cfg: DictConfig, job: TrainingJob, run_dir: Path | None = None) -> dict:
    """Runs the job; returns its metrics.json record (every process computes it, the main
    process writes it)."""
    run_dir = Path(run_dir or hydra_run_dir())
    job.check(cfg)
    budget_settings(cfg)  # checked before any data is read
    check_hub_settings(cfg)
    args = build_training_arguments(cfg, run_dir, report_to(cfg))
    checkpoint = resume_checkpoint(cfg.resume, args)  # a wrong run directory fails here
    set_seed(args.seed)
    with args.main_process_first(desc=job.preparing):
        data = job.prepare_data(cfg, args)
    pad_to = cfg.pad_to_multiple_of if (args.bf16 or args.fp16) else None
    clock = training_clock()
    trainer, hyperparameters = job.build_trainer(cfg, args, data, pad_to)
    trainer.add_callback(ClockCallback(clock, checkpoint))
    for callback in job.callbacks(cfg, trainer, data, clock):
        trainer.add_callback(callback)
    hyperparameters = {**hyperparameters, **budget_hyperparameters(cfg)}
    run = train(cfg, run_dir, trainer, hyperparameters, checkpoint, clock=clock)
    outcome = job.outcome(cfg, trainer, data, run, run_dir, hyperparameters)
    model_dir = run_dir / "model"
    if run.main:
        write_json_atomic(run_dir / METRICS_FILE, outcome.record)
        write_card(run_card(cfg, outcome.record), model_dir)
        where = finish_wandb(run, outcome.final, hyperparameters["num_parameters"],
                             outcome.headline)
        print(outcome.printout(where))
    record = job.after(cfg, outcome.record, run_dir, run.main)
    if run.main and record is not outcome.record:  # what `after` added: downstream scores
        write_card(run_card(cfg, record), model_dir)
    if trainer.args.push_to_hub:  # every process: a sharded model saves from all
        push_model(trainer, run_card(cfg, record), model_dir)
    return record

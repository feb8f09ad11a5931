"""The steps every training job shares, finetunes and pretraining alike, as three calls that a
job makes top-down (bertkit.training.finetune.finetune, bertkit.pretraining.run.pretrain):

    start_run   the shared settings checks, TrainingArguments, the checkpoint to resume (a
                wrong run directory fails here, before any data is read), the seed
    train_run   the run's training clock and the job's callbacks on the trainer, then train
                (lifecycle: early stopping, train_fraction, time budget, resume, W&B)
    publish     metrics.json, the model's card (model/README.md), the W&B summary and the
                printout (main process); push_if_asked: the Hub push (trainer.push_to_hub)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from transformers import Trainer, TrainingArguments, set_seed

from bertkit.data.atomic_files import write_json_atomic
from bertkit.data.metrics_file import METRICS_FILE
from bertkit.secret_masking import mask_secrets
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
from bertkit.training.static_shapes import padding_multiple, static_shapes_pay


@dataclass
class RunSetup:
    """What start_run settled before the job reads its data."""

    run_dir: Path
    args: TrainingArguments
    checkpoint: str | None  # the checkpoint to resume from (None: from the start)
    clock: TrainingClock  # the run's training clock, started by the trainer's ClockCallback
    pad_to_multiple_of: int | None  # finetuning batches' widths (static_shapes.padding_multiple)
    static_shapes: bool  # finetuning batches at full rows too (static_shapes.static_shapes_pay)


@dataclass
class Outcome:
    """What a trained job reports: metrics.json's record, the final scores for W&B's summary
    (final/<key>), its headline (main metric, value) if it has one, and the printout (given
    the line saying where the W&B run went)."""

    record: dict
    final: dict[str, float]
    headline: tuple[str, float] | None
    printout: Callable[[str], str]


def hydra_run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def training_clock() -> TrainingClock:
    """The run's training clock (a function: tests hand in one with a fake time)."""
    return TrainingClock()


def start_run(cfg: DictConfig, run_dir: Path | None = None) -> RunSetup:
    """Called after the job's own settings checks (the schema's check_ranges first among them:
    finetune and check_pretraining_config) and before it reads any data."""
    run_dir = Path(run_dir or hydra_run_dir())
    budget_settings(cfg)
    check_hub_settings(cfg)
    args = build_training_arguments(cfg, run_dir, report_to(cfg.logger))
    checkpoint = resume_checkpoint(cfg.resume, args)
    set_seed(args.seed)
    pad_to = padding_multiple(cfg, args.bf16 or args.fp16)
    return RunSetup(run_dir, args, checkpoint, training_clock(), pad_to, static_shapes_pay(cfg))


def train_run(cfg: DictConfig, setup: RunSetup, trainer: Trainer, hyperparameters: dict,
              callbacks: Iterable = ()) -> TrainingRun:
    """Trains `trainer` with the job's `callbacks` after the clock's; `hyperparameters` (with
    the time budget's added) go to W&B and are kept in the returned run."""
    trainer.add_callback(ClockCallback(setup.clock, setup.checkpoint))
    for callback in callbacks:
        trainer.add_callback(callback)
    hyperparameters = {**hyperparameters, **budget_hyperparameters(cfg)}
    return train(cfg, setup.run_dir, trainer, hyperparameters, setup.checkpoint,
                 clock=setup.clock)


def publish(cfg: DictConfig, setup: RunSetup, run: TrainingRun, outcome: Outcome) -> None:
    """The job's results where users read them; files are written by the main process only."""
    if not run.main:
        return
    write_json_atomic(setup.run_dir / METRICS_FILE, mask_secrets(outcome.record))
    write_card(run_card(cfg, outcome.record), setup.run_dir / "model")
    where = finish_wandb(run, outcome.final, run.hyperparameters["num_parameters"],
                         outcome.headline)
    print(outcome.printout(where))


def push_if_asked(cfg: DictConfig, setup: RunSetup, trainer: Trainer, record: dict) -> None:
    """The model and its card to the Hub with trainer.push_to_hub=true; on every process (a
    sharded model saves from all)."""
    if trainer.args.push_to_hub:
        push_model(trainer, run_card(cfg, record), setup.run_dir / "model")

"""What every recipe family does around Trainer.train, in one place: the tracker Trainer
reports to, early stopping, the W&B run and the resolved config.yaml on the main process,
resuming from the last checkpoint when asked, the training time, and closing the W&B run with
the final scores.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from transformers import EarlyStoppingCallback, Trainer

from bertkit.errors import BertkitError
from bertkit.experiment_logging import resolve_wandb_mode, start_wandb_run
from bertkit.run_outputs import write_text_atomic
from bertkit.training_setup import last_checkpoint

logger = logging.getLogger(__name__)


def report_to(cfg: DictConfig) -> list[str]:
    """Trainer's trackers: W&B unless logger=none or its mode is disabled."""
    mode = resolve_wandb_mode(cfg.logger.mode)
    return ["wandb"] if cfg.logger.backend == "wandb" and mode != "disabled" else []


@dataclass
class TrainingRun:
    main: bool  # this is the process that writes results
    wandb_run: Any  # the open W&B run (main process, W&B on), else None
    output: Any  # Trainer's TrainOutput
    seconds: float


def add_early_stopping(cfg: DictConfig, trainer: Trainer) -> None:
    """early_stopping.patience: Trainer's EarlyStoppingCallback on the checkpoint-selecting
    metric; checked here so that a missing setting is one message, not Trainer's assertion."""
    settings = OmegaConf.select(cfg, "early_stopping")
    if settings is None or settings.patience is None:
        return
    if int(settings.patience) < 1:
        raise BertkitError(f"early_stopping.patience={settings.patience}: expected a positive "
                           f"integer (or null to turn early stopping off)")
    args = trainer.args
    # The config's value: TrainingArguments fills in "loss" by itself, which GLUE's evaluation
    # names eval_validation_loss, and Trainer would then turn early stopping off with a warning.
    watched = OmegaConf.select(cfg, "trainer.metric_for_best_model")
    if not watched or not args.load_best_model_at_end:
        raise BertkitError("early_stopping.patience needs trainer.metric_for_best_model (the dev "
                           "metric to watch, e.g. validation_accuracy for GLUE) and "
                           "trainer.load_best_model_at_end=true")
    if args.eval_strategy == "no":
        raise BertkitError("early_stopping.patience needs evaluations: set trainer.eval_strategy "
                           "to epoch or steps")
    trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=int(settings.patience),
                                               early_stopping_threshold=settings.threshold))


def train(cfg: DictConfig, run_dir: Path, trainer: Trainer, hyperparameters: dict) -> TrainingRun:
    add_early_stopping(cfg, trainer)
    main = trainer.is_world_process_zero()
    uses_wandb = "wandb" in (trainer.args.report_to or [])
    wandb_run = start_wandb_run(cfg, run_dir, hyperparameters) if main and uses_wandb else None
    if main:
        write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    checkpoint = last_checkpoint(trainer.args) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        logger.warning("resume=true but %s holds no checkpoint: training from the start",
                       trainer.args.output_dir)
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=checkpoint)
    return TrainingRun(main, wandb_run, output, time.perf_counter() - started)


def finish_wandb(run: TrainingRun, final: dict[str, float], num_parameters: int) -> str:
    """The final scores into the run's summary as final/<key>, then close it; returns a line
    saying where the run went."""
    if run.wandb_run is None:
        return "W&B: off"
    for key, value in final.items():
        run.wandb_run.summary[f"final/{key}"] = value
    run.wandb_run.summary["num_parameters"] = num_parameters
    where = f"W&B run: {run.wandb_run.dir if run.wandb_run.offline else run.wandb_run.url}"
    run.wandb_run.finish()
    return where

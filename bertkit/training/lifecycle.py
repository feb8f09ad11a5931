"""What every recipe family does around Trainer.train, in one place: the tracker Trainer
reports to, early stopping, stopping at a share of the schedule (successive halving), the W&B
run and the resolved config.yaml on the main process, resuming from the last checkpoint when
asked, the training time, and closing the W&B run with the final scores.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from transformers import EarlyStoppingCallback, Trainer, TrainerCallback

from bertkit.data.atomic_files import write_text_atomic
from bertkit.errors import BertkitError
from bertkit.training.arguments import last_checkpoint
from bertkit.training.wandb_logging import resolve_wandb_mode, start_wandb_run

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
    planned_steps: int  # the whole schedule's optimizer steps
    complete: bool  # False when train_fraction stopped it before the end of its schedule

    def train_record(self, **sizes) -> dict:
        """metrics.json's "train": the loss, how far training went of its schedule (successive
        halving's accounting), its time, and the family's data sizes."""
        return {"loss": self.output.training_loss, "steps": self.output.global_step,
                "planned_steps": self.planned_steps, "complete": self.complete,
                "seconds": round(self.seconds, 2), **sizes}


def result_header(cfg: DictConfig, seed: int, main_value: float) -> dict:
    """The keys every finetuning metrics.json starts with: what bertkit-report
    (run_results.read_run) identifies and ranks a run by."""
    return {"recipe": cfg.recipe.name, "task": cfg.task.name,
            "model": cfg.model.name_or_path or "from_scratch", "seed": seed,
            "main_metric": cfg.task.main_metric, "main_value": main_value}


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


class StopAtStepShare(TrainerCallback):
    """Stop (and save a checkpoint) once `share` of the planned optimizer steps are done.

    The schedule stays the whole run's (learning-rate decay over all planned steps), so a run
    continued with resume=true goes on exactly as if it had never stopped.
    """

    def __init__(self, share: float):
        self.share = share
        self.stopped = False

    def stop_step(self, max_steps: int) -> int:
        return max(1, math.ceil(self.share * max_steps))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.stop_step(state.max_steps):
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True
            # At an epoch's end the uninterrupted run evaluates before going on, and every
            # evaluation draws from the RNG (a DataLoader iterator takes a seed): evaluate now,
            # so that the checkpoint (saved after evaluating) holds the RNG state the
            # uninterrupted run continues from.
            at_epoch_end = abs(state.epoch - round(state.epoch)) < 1e-9
            if str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "epoch" \
                    and at_epoch_end:
                control.should_evaluate = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped:
            control.should_evaluate = False  # done in on_step_end, before the checkpoint
        return control


def add_train_fraction(cfg: DictConfig, trainer: Trainer) -> StopAtStepShare | None:
    share = OmegaConf.select(cfg, "train_fraction")
    if share is None:
        return None
    if not 0.0 < float(share) <= 1.0:
        raise BertkitError(f"train_fraction={share}: expected a number in (0, 1], or null for "
                           f"the whole schedule")
    if float(share) == 1.0:
        return None
    callback = StopAtStepShare(float(share))
    trainer.add_callback(callback)
    return callback


def train(cfg: DictConfig, run_dir: Path, trainer: Trainer, hyperparameters: dict) -> TrainingRun:
    add_early_stopping(cfg, trainer)
    stopper = add_train_fraction(cfg, trainer)
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
    seconds = time.perf_counter() - started
    state = trainer.state
    # Early stopping also ends a run before max_steps; only the step share leaves it incomplete.
    complete = stopper is None or state.global_step >= state.max_steps
    return TrainingRun(main, wandb_run, output, seconds, state.max_steps, complete)


def finish_wandb(run: TrainingRun, final: dict[str, float], num_parameters: int,
                 headline: tuple[str, float] | None = None) -> str:
    """The final scores into the run's summary as final/<key>, the task's main metric and
    value (what bertkit-report ranks by, also from offline run files), then close it; returns
    a line saying where the run went."""
    if run.wandb_run is None:
        return "W&B: off"
    for key, value in final.items():
        run.wandb_run.summary[f"final/{key}"] = value
    run.wandb_run.summary["num_parameters"] = num_parameters
    run.wandb_run.summary["train/complete"] = run.complete
    run.wandb_run.summary["train/planned_steps"] = run.planned_steps
    if headline is not None:
        run.wandb_run.summary["main_metric"], run.wandb_run.summary["main_value"] = headline
    where = f"W&B run: {run.wandb_run.dir if run.wandb_run.offline else run.wandb_run.url}"
    run.wandb_run.finish()
    return where

"""What every job does around Trainer.train, in one place: the tracker Trainer
reports to, early stopping, stopping at a share of the schedule (successive halving), the W&B
run and the resolved config.yaml on the main process, resuming from the newest complete
checkpoint when asked (bertkit.training.checkpoints), each checkpoint fsynced once saved
(bertkit.training.durable_checkpoints), saving and stopping on a preemption
signal (bertkit.training.preemption), training to a time budget (bertkit.training.budget;
its progress bar, bertkit.training.budget_progress), the training time and throughput
(bertkit.training.throughput), and closing the W&B run with the final scores.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from bertkit.data.atomic_files import (
    failed_write,
    refused_write,
    telling_failed_writes,
    write_yaml_atomic,
)
from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets, remember_secrets
from bertkit.training.budget import add_budget
from bertkit.training.budget_progress import show_budget_progress
from bertkit.training.checkpoint_files import checkpoint_fault
from bertkit.training.checkpoints import scan_checkpoints
from bertkit.training.clock import TrainingClock
from bertkit.training.durable_checkpoints import DurableCheckpoints
from bertkit.training.preemption import Preempted, PreemptionCallback
from bertkit.training.stopping import add_early_stopping, add_train_fraction
from bertkit.training.throughput import add_throughput
from bertkit.training.wandb_logging import resolve_wandb_mode, start_wandb_run

logger = logging.getLogger(__name__)


def report_to(logger_node: DictConfig) -> list[str]:
    """Trainer's trackers, from the `logger` node (not this module's `logger`): W&B unless
    logger=none or its mode is disabled."""
    mode = resolve_wandb_mode(logger_node.mode)
    return ["wandb"] if logger_node.backend == "wandb" and mode != "disabled" else []


@dataclass
class TrainingRun:
    main: bool  # this is the process that writes results
    wandb_run: Any  # the open W&B run (main process, W&B on), else None
    output: Any  # Trainer's TrainOutput
    seconds: float
    planned_steps: int  # the whole schedule's optimizer steps
    complete: bool  # False when train_fraction stopped it before the end of its schedule
    throughput: dict | None = None  # the whole run's ThroughputMeter.record (None: disabled)
    training_seconds: float | None = None  # the training clock at the end, earlier runs' included
    budget: dict | None = None  # {"minutes", "ended_by_budget"} when budget.minutes is set
    hyperparameters: dict = field(default_factory=dict)  # as recorded in W&B and metrics.json
    # The epochs really trained (Trainer's state.epoch, fractional): max_steps, early
    # stopping, train_fraction or a time budget end a run before num_train_epochs.
    epochs: float | None = None

    def train_record(self, **sizes) -> dict:
        """metrics.json's "train": the loss, how far training went of its schedule (successive
        halving's accounting), its time (seconds: this train() call's; training_seconds: the
        training clock's, across resumes), the time budget, the family's data sizes, and the
        throughput."""
        throughput = {"throughput": self.throughput} if self.throughput is not None else {}
        clock = {} if self.training_seconds is None \
            else {"training_seconds": round(self.training_seconds, 2)}
        budget = {"budget": self.budget} if self.budget is not None else {}
        return {"loss": self.output.training_loss, "steps": self.output.global_step,
                "epochs": self.epochs, "planned_steps": self.planned_steps,
                "complete": self.complete,
                "seconds": round(self.seconds, 2), **clock, **budget, **sizes, **throughput}


def result_header(cfg: DictConfig, family: str, seed: int, main_value: float) -> dict:
    """The keys every finetuning metrics.json starts with: what bertkit-report identifies and
    ranks a run by (bertkit.data.metrics_file)."""
    return {"recipe": cfg.recipe.name, "family": family, "task": cfg.task.name,
            # Two-stage finetuning's target starts from the first stage's encoder; the run is
            # still named by the checkpoint it all started from (model.started_from).
            "model": (OmegaConf.select(cfg, "model.started_from") or cfg.model.name_or_path
                      or "from_scratch"), "seed": seed,
            "main_metric": cfg.task.main_metric, "main_value": main_value}


RESUME = (False, True, "auto")


def resume_checkpoint(resume, args) -> str | None:
    """resume=true: the run directory's newest complete checkpoint, and an error when there is
    none (a mistyped hydra.run.dir must not silently train from the start); resume=auto
    (preemptible cluster jobs): the newest complete checkpoint if there is one, else from the
    start. Checkpoints whose save was cut short are skipped, each named with why
    (bertkit.training.checkpoints)."""
    if resume not in RESUME:
        raise BertkitError(f"resume={resume!r}: expected false, true or auto")
    if resume is False:
        return None
    scan = scan_checkpoints(args.output_dir, weights_only=args.save_only_model)
    if scan.complete is None and resume is True:
        found = (f"only incomplete checkpoints ({scan.describe_skipped()})" if scan.skipped
                 else "no checkpoint")
        raise BertkitError(f"resume=true but {args.output_dir} holds {found}: give "
                           f"hydra.run.dir=<the run to continue>, or resume=auto to start "
                           f"from the beginning when there is none")
    if scan.skipped:
        logger.warning("resume=%s: skipped incomplete checkpoints in %s (%s)", resume,
                       args.output_dir, scan.describe_skipped())
    if scan.complete is None:
        logger.info("resume=auto: no complete checkpoint in %s, training from the start",
                    args.output_dir)
        return None
    return str(scan.complete)


def train(cfg: DictConfig, run_dir: Path, trainer: Trainer, hyperparameters: dict,
          checkpoint: str | None = None, *, clock: TrainingClock) -> TrainingRun:
    """Trains from `checkpoint` (resume_checkpoint's choice, made before any data is read);
    `clock` is the run's training clock, started by the trainer's ClockCallback."""
    add_early_stopping(cfg, trainer)
    stopper = add_train_fraction(cfg, trainer)
    budget = add_budget(cfg, trainer, clock)
    if budget is not None:  # the bar counts the budget's time, not max_steps
        show_budget_progress(trainer, budget)
    meter = add_throughput(cfg, trainer)
    preemption = PreemptionCallback(
        agree_every_steps=OmegaConf.select(cfg, "agree_every_steps", default=1))
    trainer.add_callback(preemption)
    if OmegaConf.select(cfg, "fsync_checkpoints", default=True):
        trainer.add_callback(DurableCheckpoints())
    main = trainer.is_world_process_zero()
    uses_wandb = "wandb" in (trainer.args.report_to or [])
    wandb_run = start_wandb_run(cfg, run_dir, hyperparameters) if main and uses_wandb else None
    if main:
        remember_secrets(cfg)
        settings = mask_secrets(OmegaConf.to_container(cfg, resolve=True))
        write_yaml_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(settings)))
    started = time.perf_counter()
    try:
        output = _train_or_explain(trainer, checkpoint)
    finally:
        preemption.restore_handlers()
    seconds = time.perf_counter() - started
    try:
        preemption.raise_if_stopped(trainer.args.output_dir)
    except Preempted as err:
        if wandb_run is not None:  # W&B shows the run as preempted, not failed
            wandb_run.mark_preempting()
            wandb_run.finish(exit_code=err.exit_status)
        raise
    training_seconds = clock.elapsed()
    state = trainer.state
    # Early stopping also ends a run before max_steps; only the step share leaves it incomplete.
    complete = stopper is None or state.global_step >= state.max_steps
    return TrainingRun(main, wandb_run, output, seconds, state.max_steps, complete,
                       meter.record if meter is not None else None, training_seconds,
                       budget.record() if budget is not None else None, hyperparameters,
                       state.epoch)


def _train_or_explain(trainer: Trainer, checkpoint: str | None):
    """Trainer.train, with a refused write (a full disk, most often during a checkpoint save)
    told as one line: the file, the space left, and which checkpoint is still whole. The
    checkpoint the save left half written is removed (the main process's), so that only
    whole ones remain and the space it took is free again."""
    try:
        return trainer.train(resume_from_checkpoint=checkpoint)
    except Exception as err:
        if refused_write(err) is None:
            raise
        output_dir, weights_only = Path(trainer.args.output_dir), trainer.args.save_only_model
        saving = output_dir / f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
        torn = saving.is_dir() and checkpoint_fault(saving, weights_only=weights_only) is not None
        whole = scan_checkpoints(output_dir, weights_only=weights_only).complete
        kept = (f"the last complete checkpoint, {whole}, is intact: free some space and run "
                f"the same command with resume=auto" if whole is not None
                else "no complete checkpoint was saved before it")
        raise failed_write(
            err, f"{saving.name}, removed" if torn else "training", saving if torn else output_dir,
            leftovers=[saving] if torn and trainer.args.should_save else [], then=kept) from err


@contextmanager
def saving_model(model_dir: Path, main: bool):
    """The block that saves the trained model into model_dir: a refused write ends it in one
    line, and the folder it started is removed (the main process's), so that no half-saved
    model is left behind."""
    started_it = not model_dir.exists()
    with telling_failed_writes(
            "the trained model, removed" if started_it else "the trained model", model_dir,
            leftovers=lambda: [model_dir] if started_it and main else [],
            then="free some space and run the same command with resume=auto"):
        yield


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
    for key, value in (run.throughput or {}).items():  # the whole run's, beside the curves
        if value is not None:
            run.wandb_run.summary[f"throughput/{key}"] = value
    if headline is not None:
        run.wandb_run.summary["main_metric"], run.wandb_run.summary["main_value"] = headline
    where = f"W&B run: {run.wandb_run.dir if run.wandb_run.offline else run.wandb_run.url}"
    run.wandb_run.finish()
    return where

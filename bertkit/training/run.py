"""The run lifecycle every training job shares, finetunes and pretraining alike: the run
started (TrainingArguments from bertkit.training.arguments, the checkpoint to resume, the
seed), what happens around Trainer.train (early stopping, train_fraction, a time budget,
preemption, W&B) and the publishing of the results. One module because a job reads it
top-down as one story: start_run, train_run, publish, push_if_asked (each section below says
why it does what it does).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from bertkit.data.atomic_files import (
    failed_write,
    refused_write,
    telling_failed_writes,
    write_json_atomic,
    write_yaml_atomic,
)
from bertkit.data.metrics_file import LIMITED_SAMPLES, METRICS_FILE, limited_samples
from bertkit.errors import BertkitError
from bertkit.secret_masking import mask_secrets, remember_secrets
from bertkit.training.arguments import build_training_arguments
from bertkit.training.budget import (
    Budget,
    ClockCallback,
    TrainingClock,
    add_budget,
    add_early_stopping,
    add_train_fraction,
    budget_hyperparameters,
    run_budget,
    show_budget_progress,
)
from bertkit.training.checkpoints import (
    DurableCheckpoints,
    Preempted,
    PreemptionCallback,
    RemoveSetAsideRun,
    ResumedFrom,
    checkpoint_fault,
    checkpoint_folders,
    scan_checkpoints,
)
from bertkit.training.model_card import check_hub_settings, run_card, write_card
from bertkit.training.static_shapes import padding_multiple, static_shapes_pay
from bertkit.training.throughput import add_throughput
from bertkit.training.trainer import push_model
from bertkit.training.wandb_logging import resolve_wandb_mode, start_wandb_run

logger = logging.getLogger(__name__)


# ================================================================================================
# The steps every training job shares, finetunes and pretraining alike, as three calls that a
# job makes top-down (bertkit.training.finetune.finetune, bertkit.pretraining.run.pretrain):
#
#     start_run   the shared settings checks, TrainingArguments, the checkpoint to resume (a
#                 wrong run directory fails here, before any data is read), the seed
#     train_run   the run's training clock and the job's callbacks on the trainer, then train
#                 (below: early stopping, train_fraction, time budget, resume, W&B)
#     publish     metrics.json, the model's card (model/README.md), the W&B summary and the
#                 printout (main process); push_if_asked: the Hub push (trainer.push_to_hub)

@dataclass
class RunSetup:
    """What start_run settled before the job reads its data; the job's config, which the
    later steps read their keys from (the callbacks, the card, keep_checkpoints)."""

    cfg: DictConfig
    run_dir: Path
    args: TrainingArguments
    checkpoint: str | None  # the checkpoint to resume from (None: from the start)
    clock: TrainingClock  # the run's training clock, started by the trainer's ClockCallback
    pad_to_multiple_of: int | None  # finetuning batches' widths (static_shapes.padding_multiple)
    static_shapes: bool  # finetuning batches at full rows too (static_shapes.static_shapes_pay)
    budget: Budget | None  # budget.* (budget.run_budget; None: no time budget)


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
    budget = run_budget(cfg.budget, cfg.train_fraction)
    check_hub_settings(cfg)
    args = build_training_arguments(cfg, run_dir, report_to(cfg.logger))
    checkpoint = resume_checkpoint(cfg.resume, args)
    set_seed(args.seed)
    return RunSetup(cfg, run_dir, args, checkpoint, training_clock(),
                    padding_multiple(cfg, args.bf16 or args.fp16), static_shapes_pay(cfg), budget)


def train_run(cfg: DictConfig, setup: RunSetup, trainer: Trainer, hyperparameters: dict,
              callbacks: Iterable = (), limited_samples: dict | None = None) -> TrainingRun:
    """Trains `trainer` from the checkpoint start_run chose, with bertkit's callbacks and the
    job's `callbacks`; `hyperparameters` (with the time budget's added) go to W&B and are kept
    in the returned run. `limited_samples`: the parts of the data the job cut, as read
    (bertkit.data.metrics_file): its W&B run is tagged and grouped apart from the start."""
    watch = attach_callbacks(setup, trainer, callbacks)
    hyperparameters, wandb_run = record_settings(cfg, setup, trainer, hyperparameters,
                                                 limited_samples)
    started = time.perf_counter()
    try:
        output = _train_or_explain(trainer, setup.checkpoint)
    finally:
        watch.preemption.restore_handlers()
    seconds = time.perf_counter() - started
    try:
        watch.preemption.raise_if_stopped(trainer.args.output_dir)
    except Preempted as err:
        if wandb_run is not None:  # W&B shows the run as preempted, not failed
            wandb_run.mark_preempting()
            wandb_run.finish(exit_code=err.exit_status)
        raise
    state = trainer.state
    # Early stopping also ends a run before max_steps; only the step share leaves it incomplete.
    complete = watch.stopper is None or state.global_step >= state.max_steps
    return TrainingRun(trainer.is_world_process_zero(), wandb_run, output, seconds,
                       state.max_steps, complete,
                       watch.meter.record if watch.meter is not None else None,
                       setup.clock.elapsed(),
                       watch.budget.record() if watch.budget is not None else None,
                       hyperparameters, state.epoch)


def publish(setup: RunSetup, run: TrainingRun, outcome: Outcome) -> None:
    """The job's results where users read them, each marking a score on part of the data
    (bertkit.data.metrics_file): metrics.json, the model's card, the W&B summary and the
    printout; files are written by the main process only."""
    if not run.main:
        return
    write_json_atomic(setup.run_dir / METRICS_FILE, mask_secrets(outcome.record))
    write_card(run_card(setup.cfg, outcome.record), setup.run_dir / "model")
    if run.complete and not setup.cfg.keep_checkpoints:
        removed = remove_checkpoints(Path(setup.args.output_dir))
        if removed:
            logger.info("keep_checkpoints=false: removed the finished run's %s from %s "
                        "(model/ holds the trained model)", ", ".join(removed),
                        setup.args.output_dir)
    where = finish_wandb(run, outcome.final, run.hyperparameters["num_parameters"],
                         outcome.headline, limited_samples(outcome.record))
    print(outcome.printout(where))


def remove_checkpoints(output_dir: Path) -> list[str]:
    """Removes the checkpoint-N folders of a finished run (and their folder, then empty);
    returns their names. Only once model/ and metrics.json are written: what a user keeps
    of a finished run is there, and a checkpoint only serves to train it on."""
    folders = checkpoint_folders(output_dir)
    for folder in folders:
        shutil.rmtree(folder)
    if output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()
    return [folder.name for folder in folders]


def push_if_asked(setup: RunSetup, trainer: Trainer, record: dict) -> None:
    """The model and its card to the Hub with trainer.push_to_hub=true; on every process (a
    sharded model saves from all)."""
    if trainer.args.push_to_hub:
        push_model(trainer, run_card(setup.cfg, record), setup.run_dir / "model")


# ================================================================================================
# What every job does around Trainer.train, in one place: the tracker Trainer
# reports to, early stopping, stopping at a share of the schedule (successive halving), the W&B
# run and the resolved config.yaml on the main process, resuming from the newest complete
# checkpoint when asked, each checkpoint fsynced once saved, saving and stopping on a
# preemption signal (all three bertkit.training.checkpoints), training to a time budget and its
# progress bar (bertkit.training.budget), the training time and throughput
# (bertkit.training.throughput), and closing the W&B run with the final scores.


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


def result_header(recipe: str, task: DictConfig, model: DictConfig, family: str, seed: int,
                  main_value: float) -> dict:
    """The keys every finetuning metrics.json starts with: what bertkit-report identifies and
    ranks a run by (bertkit.data.metrics_file); `recipe`: recipe.name."""
    return {"recipe": recipe, "family": family, "task": task.name,
            # Two-stage finetuning's target starts from the first stage's encoder; the run is
            # still named by the checkpoint it all started from (model.started_from).
            "model": (OmegaConf.select(model, "started_from") or model.name_or_path
                      or "from_scratch"), "seed": seed,
            "main_metric": task.main_metric, "main_value": main_value}


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


@dataclass
class Watch:
    """The callbacks train_run reads back after training (None: that one is off)."""

    preemption: PreemptionCallback
    stopper: Any  # train_fraction's
    budget: Any  # the time budget's
    meter: Any  # the throughput meter


def attach_callbacks(setup: RunSetup, trainer: Trainer, callbacks: Iterable) -> Watch:
    """The training clock's callback first (it starts the clock), the removal of an overwritten
    run set aside for this one (its training begins), the job's `callbacks`, then early
    stopping, train_fraction, the time budget (and its progress bar), the throughput meter,
    preemption and durable checkpoints."""
    trainer.add_callback(ClockCallback(setup.clock, setup.checkpoint))
    trainer.add_callback(ResumedFrom(setup.checkpoint))
    trainer.add_callback(RemoveSetAsideRun())
    for callback in callbacks:
        trainer.add_callback(callback)
    cfg = setup.cfg
    # The config's metric, not TrainingArguments' (it fills in "loss" by itself); a trainer
    # group without the key (pretraining's) watches none.
    add_early_stopping(cfg.early_stopping, OmegaConf.select(cfg, "trainer.metric_for_best_model"),
                       trainer)
    stopper = add_train_fraction(cfg.train_fraction, trainer)
    budget = add_budget(setup.budget, trainer, setup.clock, cfg.agree_every_steps)
    if budget is not None:  # the bar counts the budget's time, not max_steps
        show_budget_progress(trainer, budget)
    meter = add_throughput(cfg.throughput, trainer)
    preemption = PreemptionCallback(cfg.agree_every_steps)
    trainer.add_callback(preemption)
    if cfg.fsync_checkpoints:
        trainer.add_callback(DurableCheckpoints())
    return Watch(preemption, stopper, budget, meter)


def record_settings(cfg: DictConfig, setup: RunSetup, trainer: Trainer,
                    hyperparameters: dict, limited_samples: dict | None = None
                    ) -> tuple[dict, Any]:
    """The run's hyperparameters with the time budget's, the W&B run started with them (main
    process, W&B on; else None), and the resolved settings in run_dir/config.yaml with
    secrets masked (main process)."""
    hyperparameters = {**hyperparameters, **budget_hyperparameters(setup.budget)}
    if not trainer.is_world_process_zero():
        return hyperparameters, None
    resolved = OmegaConf.to_container(cfg, resolve=True)  # once, for W&B and config.yaml
    wandb_run = None
    if "wandb" in (trainer.args.report_to or []):
        wandb_run = start_wandb_run(cfg.logger, cfg.recipe.name, resolved, setup.run_dir,
                                    hyperparameters, limited_samples)
    remember_secrets(cfg)
    write_yaml_atomic(setup.run_dir / "config.yaml",
                      OmegaConf.to_yaml(OmegaConf.create(mask_secrets(resolved))))
    return hyperparameters, wandb_run


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
                 headline: tuple[str, float] | None = None,
                 limited: dict | None = None) -> str:
    """The final scores into the run's summary as final/<key>, the task's main metric and
    value (what bertkit-report ranks by, also from offline run files), and the parts of the
    data that were cut (limited_samples, bertkit.data.metrics_file), then close it; returns
    a line saying where the run went."""
    if run.wandb_run is None:
        return "W&B: off"
    if limited:
        run.wandb_run.summary[LIMITED_SAMPLES] = limited
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

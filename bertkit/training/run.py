"""The run lifecycle every training job shares, finetunes and pretraining alike: the run
started (its TrainingArguments, the checkpoint to resume, the seed), what happens around
Trainer.train (early stopping, train_fraction, a time budget, preemption, W&B) and the
publishing of the results. One module because a job reads it top-down as one story:
start_run, train_run, publish, push_if_asked (each section below says why it does what it
does). Starting a run includes what it is started with, in the sections after the story:
TrainingArguments from the `trainer` group plus what bertkit decides for the user, the facts
of the launch it runs in (process ranks, the run directory's time stamp, a SLURM job's tasks
joined by submitit), and whether progress bars are drawn.
"""

from __future__ import annotations

import copy
import copyreg
import importlib.util
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import huggingface_hub.utils
import psutil
import torch
import transformers.utils.logging
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
from bertkit.training.model_card import is_repo_id, run_card, write_card
from bertkit.training.stop_and_resume import (
    Budget,
    ClockCallback,
    DurableCheckpoints,
    Preempted,
    PreemptionCallback,
    RemoveSetAsideRun,
    ResumedFrom,
    TrainingClock,
    add_budget,
    add_early_stopping,
    add_train_fraction,
    budget_hyperparameters,
    checkpoint_fault,
    checkpoint_folders,
    run_budget,
    scan_checkpoints,
    show_budget_progress,
)
from bertkit.training.throughput import add_throughput
from bertkit.training.trainer import padding_multiple, push_model, static_shapes_pay
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
    pad_to_multiple_of: int | None  # finetuning batches' widths (trainer.padding_multiple)
    static_shapes: bool  # finetuning batches at full rows too (trainer.static_shapes_pay)
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


def check_hub_settings(cfg: DictConfig) -> None:
    """Before any data is read, the settings of what the run publishes (push_if_asked, below):
    without hub_model_id Trainer would name the repository after the checkpoint folder
    ("checkpoints"); a base_model the card gives must be a Hub id."""
    if cfg.trainer.push_to_hub and not cfg.trainer.hub_model_id:
        raise BertkitError("trainer.push_to_hub=true needs trainer.hub_model_id=<user>/<name>, "
                           "the Hub repository to push to")
    base = cfg.model_card.base_model
    if base and not is_repo_id(str(base)):
        raise BertkitError(f"model_card.base_model={base}: expected the Hub id of a model "
                           f"(<user>/<name>), not a path")


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
# preemption signal (all three bertkit.training.stop_and_resume), training to a time budget and its
# progress bar (bertkit.training.stop_and_resume), the training time and throughput
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
    (bertkit.training.stop_and_resume)."""
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


# ================================================================================================
# TrainingArguments from the `trainer` config group, plus what bertkit decides for the user:
# mixed precision on a GPU, where checkpoints go, which tracker Trainer reports to, and no secret
# in the training_args.bin Trainer saves.

PRECISIONS = ("auto", "bf16", "fp16", "no")
CHECKPOINTS_DIR = "checkpoints"  # Trainer's output_dir, in the run directory


def resolve_mixed_precision(setting: str) -> str:
    """auto: bf16 where the GPU has it, else fp16 on a GPU, else full precision on the CPU
    (`setting` is one of PRECISIONS: the schema's choices, bertkit.config_schema)."""
    if setting != "auto":
        if setting != "no" and not torch.cuda.is_available():
            raise BertkitError(f"mixed_precision={setting}: needs a GPU, and none is visible")
        return setting
    if not torch.cuda.is_available():
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a SLURM
    job's cpus_per_task, a hydra/launcher=gpu_pack job's share), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def resolve_dataloader_workers(setting, on_gpu: bool, gpu_workers: int, cpus: int,
                               processes: int) -> int:
    """trainer.dataloader_num_workers: a number as given; auto: none on a CPU, where workers
    would take the cores training needs, and on a GPU gpu_workers, at most the cores each
    process has less one (its own)."""
    if setting == "auto":
        workers = max(0, min(int(gpu_workers), cpus // max(processes, 1) - 1)) if on_gpu else 0
        logger.info("trainer.dataloader_num_workers=auto: %d worker process(es) (%s, %d cores, "
                    "%d process(es))", workers, "GPU" if on_gpu else "CPU", cpus, processes)
        return workers
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise BertkitError(f"trainer.dataloader_num_workers={setting!r}: expected auto or a "
                           f"number of worker processes, 0 or more")
    return setting


# Trainer's options that shard the model over the processes of a launch: in one process
# started alone Trainer fails deep inside (FSDP: "only works in distributed training";
# DeepSpeed: an MPI lookup), so they are refused here with the command that works.
SHARDING_OPTIONS = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_sharding_launch(options: dict) -> None:
    for key, name in SHARDING_OPTIONS.items():
        value = options.get(key)
        if value and not launched():
            raise BertkitError(
                f"trainer.{key}={value!r}: {name} shards the model over the processes of a "
                f"launch, and this process was started alone: launch it with torchrun, e.g. "
                f"torchrun --nproc_per_node=N -m bertkit <the same overrides> "
                f"(docs/scale.md)")
    if options.get("deepspeed") and not deepspeed_installed():
        raise BertkitError(
            f"trainer.deepspeed={options['deepspeed']!r}: DeepSpeed is not installed; it is "
            f"an optional extra: pip install 'bertkit[deepspeed]'")


class TrainingArgumentsWithoutSecrets(TrainingArguments):
    """TrainingArguments whose pickle holds its secrets masked (trainer.hub_token: Trainer
    pickles its arguments into training_args.bin beside every checkpoint and in the model
    directory it pushes). Unpickled, it is plain TrainingArguments, readable without bertkit;
    copies in this process keep the real values (Trainer's Hub calls read them)."""

    def __reduce_ex__(self, protocol):
        # pickle's own reconstructor, naming the base class: no bertkit needed to load it
        return (copyreg._reconstructor, (TrainingArguments, object, None),
                mask_secrets(self.__dict__))

    def __copy__(self):
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo):
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone


def build_training_arguments(cfg: DictConfig, run_dir: Path, report_to: list[str],
                             trainer: dict | None = None) -> TrainingArguments:
    """TrainingArguments from the trainer node (`trainer`: further options, TrainingArguments'
    names, merged over it: a benchmark's arms), mixed_precision, progress_bars and
    gpu_dataloader_workers."""
    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    if trainer:  # names the trainer group may lack: merged outside its struct node
        options = OmegaConf.to_container(OmegaConf.merge(options, trainer), resolve=True)
    # auto: eager here; a finetune decides once it knows its length (decide_compile), so the
    # other callers (pretraining, a script's own job), which build their arguments here, compile
    # only when asked.
    options["torch_compile"] = options.get("torch_compile", False) is True
    check_sharding_launch(options)
    if options.get("disable_tqdm") is None:  # progress_bars decides (progress bars, below)
        options["disable_tqdm"] = not progress_bars_shown(cfg.progress_bars)
    precision = resolve_mixed_precision(cfg.mixed_precision)
    options["dataloader_num_workers"] = resolve_dataloader_workers(
        options.get("dataloader_num_workers", 0), torch.cuda.is_available(),
        cfg.gpu_dataloader_workers, available_cores(), world_size())
    if options["dataloader_num_workers"] == 0:
        # Prefetching and persistence are worker settings: DataLoader refuses them without.
        options.pop("dataloader_prefetch_factor", None)
        options.pop("dataloader_persistent_workers", None)
    if not torch.cuda.is_available():
        options["dataloader_pin_memory"] = False  # pinning needs a GPU; it only warns on a CPU
        if world_size() > 1:
            # Without use_cpu, accelerate opens the gloo group but reports no distributed
            # type, and each torchrun process trains alone on all the data.
            options.setdefault("use_cpu", True)
    try:
        return TrainingArgumentsWithoutSecrets(
            output_dir=str(run_dir / CHECKPOINTS_DIR),
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            report_to=report_to,
            run_name=run_dir.name,
            **options,
        )
    except TypeError as err:  # an option Trainer does not know: name it as a config key
        raise BertkitError(f"trainer: {err} (the trainer group takes TrainingArguments' "
                           f"argument names)") from None
    except ValueError as err:
        raise BertkitError(f"trainer: {err}") from None


# ================================================================================================
# Process-rank facts for torchrun / accelerate launches, readable before torch.distributed
# starts; and the same facts for a SLURM job whose tasks are the processes (submitit).

def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


def launched() -> bool:
    """Started by a distributed launcher (torchrun, accelerate launch, deepspeed, a submitit
    job's joined tasks), even as its only process: each process is given its LOCAL_RANK,
    which is also what tells Trainer that it runs distributed."""
    return "LOCAL_RANK" in os.environ


def run_stamp() -> str:
    """A time stamp for the run directory that every process of one launch agrees on.

    Each torchrun worker composes its own Hydra config, and their clocks may tick over a
    second apart; the launcher (their common parent) started once, so its start time is shared.
    BERTKIT_RUN_STAMP overrides both, e.g. for multi-node launches.
    """
    if os.environ.get("BERTKIT_RUN_STAMP"):
        return os.environ["BERTKIT_RUN_STAMP"]
    started = time.time()
    if world_size() > 1:
        started = psutil.Process(os.getppid()).create_time()
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started))


def join_submitit_tasks() -> bool:
    """Inside a submitit job with several tasks (hydra/launcher=slurm_multi_gpu: one task per
    GPU), make each task one process of a data-parallel run by exporting what torchrun would:
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (submitit's own helper derives them
    from SLURM's variables). CUDA_VISIBLE_DEVICES is left to SLURM; Trainer picks the GPU by
    LOCAL_RANK. True when it exported them."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or "RANK" in os.environ:
        return False
    import submitit

    if submitit.JobEnvironment().num_tasks < 2:
        return False
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


# ================================================================================================
# Progress bars: drawn on a terminal, never written into a log file.
#
# tqdm draws a bar by rewriting its line with carriage returns (and, for nested bars, ANSI cursor
# moves): on a terminal that is one line that moves; in a file (a redirected log, a SLURM
# output, CI, `make ... > log`) every frame is kept. The `progress_bars` key (conf/config.yaml)
# decides once per job, at its entry (bertkit.jobs.run_job):
#
#     auto   bars when the standard error, where tqdm draws, is a terminal; else none
#     true   every bar, terminal or not (datasets' bar of each map in pretraining's stages too)
#     false  no bar
#
# Without bars, each library is switched off by its own switch (datasets, transformers,
# huggingface_hub), and Trainer gets disable_tqdm=true (unless trainer.disable_tqdm is set):
# its log lines are then printed as plain lines (Trainer's PrinterCallback).
#
# A job's data preparation in several stages (pretraining's: reading the corpus, tokenising,
# building instances, ...) runs each stage in `preprocessing_stage`: one line when the stage
# ends, with its count and time, in place of datasets' bar for each map of the stage (several
# per stage: a map, a filter, a copy per duplicate); progress_bars=true keeps those bars too.

# The choices of progress_bars (bertkit.config_schema reads them).
PROGRESS_BARS = ("auto", True, False)


def stream_is_terminal() -> bool:
    """Whether tqdm's stream (the standard error) is a terminal."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bars_shown(setting) -> bool:
    """Whether bars are shown under progress_bars=`setting` ("auto", True or False)."""
    return stream_is_terminal() if setting == "auto" else setting is True


def every_bar_shown(setting) -> bool:
    """progress_bars=true: the libraries' bars inside a preprocessing stage too."""
    return setting is True


def apply_progress_bars(cfg: DictConfig) -> bool:
    """Switches the libraries' bars on or off for this job; returns whether they are shown.
    An environment variable a user set (HF_DATASETS_DISABLE_PROGRESS_BARS,
    HF_HUB_DISABLE_PROGRESS_BARS) keeps priority, as the libraries intend, without their
    warning that it does."""
    shown = progress_bars_shown(cfg.progress_bars)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if shown:
            datasets.enable_progress_bars()
            transformers.utils.logging.enable_progress_bar()
            huggingface_hub.utils.enable_progress_bars()
        else:
            datasets.disable_progress_bars()
            transformers.utils.logging.disable_progress_bar()
            huggingface_hub.utils.disable_progress_bars()
    return shown


@dataclass
class StageCount:
    """What a stage made, said in its line: set `count` and `unit` inside the stage."""

    count: int | None = None
    unit: str = ""


@contextmanager
def preprocessing_stage(name: str, *, library_bars: bool = False,
                        log: logging.Logger = logger) -> Iterator[StageCount]:
    """One stage of a job's data preparation: datasets' bars off inside it (unless
    `library_bars`), and one line when it ends: `<name>: <count> <unit> (<seconds> s)`."""
    hidden = not library_bars and datasets.is_progress_bar_enabled()
    if hidden:
        datasets.disable_progress_bars()
    made = StageCount()
    started = time.perf_counter()
    try:
        yield made
    finally:
        if hidden:
            datasets.enable_progress_bars()
    what = "done" if made.count is None else f"{made.count:,} {made.unit}".rstrip()
    log.info("%s: %s (%.1f s)", name, what, time.perf_counter() - started)

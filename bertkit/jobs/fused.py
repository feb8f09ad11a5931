"""A group of finetunes trained as one model array (hydra/launcher=fused), each member still a
run of its own: its job is prepared as any finetune is (run_job's checks, then
bertkit.training.finetune.prepare_run), all members are trained together
(bertkit.training.model_array.train_members), then each is finished as any finetune is
(finish_run: its evaluation, model/, metrics.json, card, W&B run and printout).

    prepare_member   one job, up to Trainer.train (or a finished run's result: nothing to do)
    train_group      the prepared members trained as one array
    finish_member    one job, from its trained model on

The launcher (hydra_plugins/bertkit_fused_launcher) calls each member's steps inside that
member's own Hydra job (its directory, its log, its failure record).

What a member may vary is what the array applies per member (member_keys): the
TrainingArguments fields its own optimizer and scheduler read (recorded as Trainer builds
them), its seeds and its clipping. Dropout probabilities are attributes of the one template
model every member runs through, so jobs that differ in them train in arrays of their own.
The finetuning methods that only change which parameters train or at what rate work per
member; every other method, and what stops or resumes a run on its own schedule, is
refused in one line naming its key (check_fusable).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import checked_once
from bertkit.errors import BertkitError
from bertkit.finetuning.methods import METHODS
from bertkit.jobs import check_job, prepare_job
from bertkit.tasks import task_family
from bertkit.training.finetune import PreparedRun, finish_run, prepare_run
from bertkit.training.model_array import MemberResult, train_members
from bertkit.training.run import TrainingRun, record_settings
from bertkit.training.stop_and_resume import remove_set_aside

logger = logging.getLogger(__name__)

# The finetuning methods that only choose which parameters train, or at what rate: each
# member's own model (requires_grad) and optimizer groups say so, and the array reads both.
PER_MEMBER_METHODS = ("freeze", "bitfit", "layerwise_rates")

# What the array applies per member beyond what its optimizer and scheduler read: its seeds
# (head initialisation, data order) and its clipping (ArrayAdamW clips by each member's norm).
ARRAY_ARGUMENTS = ("seed", "data_seed", "max_grad_norm")
# The root keys of the same kind: the seed (trainer.seed interpolates it).
MEMBER_ROOT_KEYS = ("seed",)
# Trainer's optimizers ArrayAdamW computes term for term.
ADAMW = ("adamw_torch", "adamw_torch_fused")


@functools.cache
def optimizer_arguments() -> frozenset[str]:
    """The TrainingArguments fields Trainer's own optimizer and scheduler read, recorded as
    Trainer builds them for a tiny model: what a member's own optimizer groups and scheduler
    hold, which ArrayAdamW and MemberSchedules read back per member."""
    import torch
    from transformers import Trainer, TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    read: set[str] = set()

    class Recording(TrainingArguments):
        recording = False

        def __getattribute__(self, name):
            if name in names and object.__getattribute__(self, "recording"):
                read.add(name)
            return object.__getattribute__(self, name)

    with tempfile.TemporaryDirectory() as directory:
        args = Recording(output_dir=directory, report_to=[], use_cpu=True)
        trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
        args.recording = True
        trainer.create_optimizer()
        trainer.create_scheduler(10, trainer.optimizer)
        args.recording = False
    return frozenset(read)


def member_keys() -> tuple[str, ...]:
    """The config keys in which the members of one array may differ: the trainer keys its
    optimizer and scheduler read (optimizer_arguments) or the array applies per member
    (ARRAY_ARGUMENTS), and the root's seed."""
    from bertkit.config_schema import TrainerSchema

    trainer = {f.name for f in dataclasses.fields(TrainerSchema)}
    per_member = (optimizer_arguments() | set(ARRAY_ARGUMENTS)) & trainer
    return (*MEMBER_ROOT_KEYS, *(f"trainer.{key}" for key in sorted(per_member)))


def check_fusable(cfg: DictConfig) -> None:
    """What a member of an array cannot do, in one line naming the key."""
    if cfg.recipe.job != "finetune":
        raise BertkitError(f"recipe.job={cfg.recipe.job}: hydra/launcher=fused trains finetunes")
    if cfg.finetuning.intermediate.task is not None:
        raise BertkitError(f"finetuning.intermediate.task={cfg.finetuning.intermediate.task}: "
                           f"two-stage finetuning does not run in a model array "
                           f"(hydra/launcher=fused); use another launcher")
    for name, entry in METHODS.items():
        if name not in PER_MEMBER_METHODS and entry.on(cfg.finetuning):
            raise BertkitError(
                f"finetuning={cfg.finetuning.name}: its {name} method does not run in a model "
                f"array (hydra/launcher=fused trains freezing, BitFit and layer-wise rates per "
                f"member); use another launcher")
    refused = {"early_stopping.patience": cfg.early_stopping.patience,
               "train_fraction": cfg.train_fraction, "budget.minutes": cfg.budget.minutes,
               "trainer.gradient_checkpointing": cfg.trainer.get("gradient_checkpointing")
               or None}
    for key, value in refused.items():
        if value is not None:
            raise BertkitError(f"{key}={value}: stops or reshapes one run on its own, which a "
                               f"model array (hydra/launcher=fused) cannot; use another launcher")
    if cfg.resume is not False:
        raise BertkitError(f"resume={cfg.resume}: a model array keeps no checkpoint to resume "
                           f"from (hydra/launcher=fused); use another launcher")
    optim = str(cfg.trainer.get("optim") or "adamw_torch_fused")
    if optim not in ADAMW:
        raise BertkitError(f"trainer.optim={optim}: a model array trains with AdamW "
                           f"({', '.join(ADAMW)})")


def prepare_member(cfg: DictConfig, run_dir: Path) -> PreparedRun | dict:
    """One member's job up to training, through run_job's checks; a dict: the finished run's
    result (resume=auto on a finished run), nothing to train."""
    check_job(cfg.recipe, OmegaConf.select(cfg, "task"))
    with checked_once(cfg):
        check_fusable(cfg)
        finished = prepare_job(cfg, run_dir)
        if finished is not None:
            return finished
        return prepare_run(cfg, task_family(cfg.task.family), run_dir)


def train_group(runs: list[PreparedRun]) -> list[MemberResult]:
    """The members trained as one array; the tokenizer's pad id pads the members' batches to
    one width."""
    tokenizer = runs[0].inputs.tokenizer
    logger.info("fused: %d members trained as one model array", len(runs))
    return train_members([run.trainer for run in runs], tokenizer.pad_token_id or 0)


def finish_member(run: PreparedRun, result: MemberResult) -> dict:
    """One member's job from its trained model on, as finish_run finishes any finetune; its
    W&B run opened now and given its history. A member whose gradients turned non-finite is
    that job's failure."""
    if result.failed_at is not None:
        raise BertkitError(f"the training loss became non-finite (NaN or infinite) at step "
                           f"{result.failed_at}; the other members of its model array "
                           f"(hydra/launcher=fused) trained on")
    trainer = run.trainer
    hyperparameters, wandb_run = record_settings(run.cfg, run.setup, trainer,
                                                 run.hyperparameters, run.limited)
    if wandb_run is not None:
        log_history(wandb_run, trainer.state.log_history)
    state = trainer.state
    # The array's process peak, as a job's throughput record gives its own process's, and
    # that peak shared by the members.
    memory = {"peak_memory_gb": result.peak_memory_gb,
              "peak_memory_per_member_gb": result.peak_memory_gb / result.members}
    trained = TrainingRun(
        trainer.is_world_process_zero(), wandb_run, result.output, result.seconds,
        state.max_steps, True, memory, result.seconds, None, hyperparameters, result.epochs)
    run.details = {**(run.details or {}),
                   "model_array": {"members": result.members, "seconds": round(result.seconds, 2),
                                   **memory}}
    record = finish_run(run, trained)
    remove_set_aside()
    return record


def log_history(wandb_run, history: list[dict]) -> None:
    """The member's log lines into its W&B run under Trainer's W&B names (train/<key>,
    eval/<key>), at their steps."""
    from transformers.integrations.integration_utils import rewrite_logs

    for entry in history:
        step = entry["step"]
        values = {key: value for key, value in entry.items() if key != "step"}
        wandb_run.log({**rewrite_logs(values), "train/global_step": step}, step=step)

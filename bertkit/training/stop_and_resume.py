"""When a run stops and what it resumes from. How long a run trains: the training clock kept
across resumes, the time budget (budget.minutes) with its learning-rate schedule and progress
bar, early stopping and stopping at a share of the schedule, all answering "stop now?" from the
same clock and the same Trainer callbacks. Then the checkpoints it can trust (the sections
after the stopping, from "Whether a checkpoint's files are whole"): each one fsynced once
saved, judged whole by its files' content before a resume reads it, written (then the job
stopped) on a preemption signal, and an overwritten run's set aside (then removed) before the
new run saves its own: is the run's newest checkpoint one it can resume from, and is it this
run's? One module because a run stops (budget, early stopping, preemption) where it saves,
and resumes from what it saved with the clock it carried.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import struct
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm
from transformers import EarlyStoppingCallback, ProgressCallback, Trainer, TrainerCallback
from transformers.trainer import (
    FSDP_MODEL_NAME,
    OPTIMIZER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from bertkit.config_schema import DECAYS
from bertkit.data.atomic_files import DamagedFile, read_json, write_json_atomic
from bertkit.errors import BertkitError
from bertkit.training.trainer import callbacks_of

# ================================================================================================
# The training clock: seconds a run has spent training, across resumes.
#
# One clock per run, shared by what reads time during training (the time budget's schedule and
# stop, the held-out evaluation's interval). Measurement (bertkit's own held-out evaluations)
# runs inside `paused()`, so how often a run is measured does not change how much it trains.
# `time_fn` is injectable so that tests drive it with a fake clock.

class TrainingClock:
    def __init__(self, time_fn: Callable[[], float] = time.monotonic):
        self.time_fn = time_fn
        self.carried = 0.0  # seconds spent before a resume (read from the checkpoint)
        self._started: float | None = None
        self._paused = 0.0  # seconds spent paused since start()

    def start(self, carried: float = 0.0) -> None:
        """Starts (or restarts, on resume) counting, on top of `carried` earlier seconds."""
        self.carried = float(carried)
        self._started = self.time_fn()
        self._paused = 0.0

    @property
    def running(self) -> bool:
        return self._started is not None

    def elapsed(self) -> float:
        """Training seconds so far: earlier runs' plus this one's, less the paused time."""
        if self._started is None:
            return self.carried
        return self.carried + (self.time_fn() - self._started) - self._paused

    @contextmanager
    def paused(self) -> Iterator[None]:
        began = self.time_fn()
        try:
            yield
        finally:
            self._paused += self.time_fn() - began


# ================================================================================================
# Training to a time budget (budget.minutes), and the training clock kept across resumes.
#
# With a budget, the learning rate is a function of the elapsed training time rather than of the
# step: warm-up over the first budget.warmup_fraction of the time, then a decay that reaches
# budget.min_lr_ratio x the peak when the time is spent, and the run stops (with a checkpoint)
# at the first optimizer step that ends at or past the budget. Runs compared at equal time then
# each get a whole schedule, whatever their speed. trainer.max_steps / num_train_epochs stay an
# upper bound.
#
# Every run (budget or not) leaves the clock's reading in each checkpoint (training_clock.json),
# so that resume=true counts the time already spent; a checkpoint without it (older runs)
# carries 0.

logger = logging.getLogger(__name__)

CLOCK_FILE = "training_clock.json"


# -- the clock across resumes ---------------------------------------------------------------
def carried_seconds(checkpoint: str | None) -> float:
    """The training seconds recorded in `checkpoint` (0 for a fresh run or an older one)."""
    if checkpoint is None:
        return 0.0
    path = Path(checkpoint) / CLOCK_FILE
    if not path.is_file():
        logger.info("%s has no %s: the training clock starts at 0", checkpoint, CLOCK_FILE)
        return 0.0
    return float(json.loads(path.read_text())["seconds"])


class ClockCallback(TrainerCallback):
    """Starts the run's clock on top of the seconds the resumed checkpoint recorded, and
    records the clock in every checkpoint saved (main process)."""

    def __init__(self, clock: TrainingClock, checkpoint: str | None):
        self.clock = clock
        self.checkpoint = checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.start(carried_seconds(self.checkpoint))

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        # Only into a checkpoint Trainer wrote: a folder holding the clock alone would look
        # like a checkpoint to resume from.
        if state.is_world_process_zero and folder.is_dir():
            write_json_atomic(folder / CLOCK_FILE, {"seconds": self.clock.elapsed()})


# -- the settings -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    minutes: float
    warmup_fraction: float
    decay: str
    min_lr_ratio: float

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def multiplier(self, elapsed: float) -> float:
        return budget_multiplier(elapsed / self.seconds, self.warmup_fraction, self.decay,
                                 self.min_lr_ratio)


def run_budget(node: DictConfig, train_fraction) -> Budget | None:
    """The run's time budget from budget.* (`node`), with the rule its schema cannot say (no
    train_fraction beside it); None when budget.minutes is null."""
    if node.minutes is None:
        return None
    # Types and ranges: bertkit.config_schema.BudgetSchema, checked before the job starts.
    minutes, warmup, decay, floor = node.minutes, node.warmup_fraction, node.decay, \
        node.min_lr_ratio
    if train_fraction is not None:
        raise BertkitError("budget.minutes with train_fraction: both cut the schedule short; "
                           "set one of them to null")
    return Budget(float(minutes), float(warmup), str(decay), float(floor))


def budget_hyperparameters(budget: Budget | None) -> dict:
    """The budget's settings under plain names for W&B and metrics.json ({} when off)."""
    if budget is None:
        return {}
    return {"budget_minutes": budget.minutes, "budget_warmup_fraction": budget.warmup_fraction,
            "budget_decay": budget.decay, "budget_min_lr_ratio": budget.min_lr_ratio}


# -- the schedule -----------------------------------------------------------------------------
def budget_multiplier(fraction: float, warmup_fraction: float, decay: str,
                      min_lr_ratio: float) -> float:
    """The learning rate's share of its peak at `fraction` of the budget's time: linear
    warm-up from 0 over the first `warmup_fraction`, then `decay` from 1 down to
    `min_lr_ratio` at the end (constant: 1 until the end), `min_lr_ratio` from then on."""
    if fraction >= 1.0:
        return min_lr_ratio
    if fraction < warmup_fraction:
        return fraction / warmup_fraction
    progress = (fraction - warmup_fraction) / (1.0 - warmup_fraction)
    if decay == "linear":
        shape = 1.0 - progress
    elif decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay == "constant":
        shape = 1.0
    else:
        raise BertkitError(f"budget.decay={decay!r}: expected one of {', '.join(DECAYS)}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def agreed_seconds(seconds: float, args) -> float:
    """Process 0's reading on every process: the learning rate and the decision to stop must
    be the same on all of them (a process that stops alone leaves the others waiting)."""
    if args.world_size <= 1 or not torch.distributed.is_initialized():
        return seconds
    reading = torch.tensor([seconds], dtype=torch.float64, device=args.device)
    torch.distributed.broadcast(reading, src=0)
    return float(reading.item())


class BudgetCallback(TrainerCallback):
    """Puts the time schedule into Trainer's scheduler and stops the run when the time is
    spent. Trainer's schedules are LambdaLR objects that set each group's rate to its base
    rate (layer-wise rates kept) x lambda(step): the lambdas are replaced by ones that ignore
    the step and read the clock, once per optimizer step, so the rate Trainer logs
    (get_last_lr) is the schedule's. After the ClockCallback, which starts the clock.

    One process reads its own clock at every step (the host's clock: no sync). Under DDP the
    processes must see one time, so they take process 0's reading at the first two steps and
    then every agree_every_steps steps (a broadcast, which waits for the GPU) and, between
    two readings, extrapolate it by the seconds a step took over the last interval: the same
    arithmetic on every process, so the rate and the stop stay identical without a collective
    per step."""

    def __init__(self, budget: Budget, clock: TrainingClock, agree_every_steps: int):
        self.budget = budget
        self.clock = clock
        self.agree_every_steps = max(1, int(agree_every_steps))
        self.elapsed = 0.0  # the clock as of the latest optimizer step, on every process
        self.ended_by_budget = False
        self._agreed: tuple[int, float] | None = None  # (step, seconds) of the last reading
        self._seconds_per_step: float | None = None  # known after two readings

    def _read_clock(self, args, step: int = 0) -> None:
        if args.world_size <= 1 or not torch.distributed.is_initialized():
            self.elapsed = self.clock.elapsed()
            return
        if self._seconds_per_step is not None and step % self.agree_every_steps:
            agreed_step, agreed = self._agreed
            self.elapsed = agreed + self._seconds_per_step * (step - agreed_step)
            return
        seconds = agreed_seconds(self.clock.elapsed(), args)
        if self._agreed is not None and step > self._agreed[0]:
            self._seconds_per_step = (seconds - self._agreed[1]) / (step - self._agreed[0])
        self._agreed = (step, seconds)
        self.elapsed = seconds

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if not isinstance(lr_scheduler, LambdaLR):
            kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
            raise BertkitError(f"budget.minutes needs one of Trainer's step schedules (a "
                               f"LambdaLR, e.g. trainer.lr_scheduler_type=linear) to replace; "
                               f"trainer.lr_scheduler_type={kind} gives "
                               f"{type(lr_scheduler).__name__}")
        self._read_clock(args)

        def multiplier(_step: int) -> float:  # a plain function: the scheduler saves none
            return self.budget.multiplier(self.elapsed)

        lr_scheduler.lr_lambdas = [multiplier] * len(lr_scheduler.lr_lambdas)
        # The first step's rate now (a resumed run's, at the time already spent), as the
        # scheduler's own step would set it; get_last_lr reads _last_lr.
        rates = [base * multiplier(0) for base in lr_scheduler.base_lrs]
        for group, rate in zip(lr_scheduler.optimizer.param_groups, rates, strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate
        lr_scheduler._last_lr = rates
        return control

    def on_optimizer_step(self, args, state, control, **kwargs):
        # Right before the scheduler's step, which reads it; global_step counts the steps done.
        self._read_clock(args, state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        if self.elapsed >= self.budget.seconds:
            self.ended_by_budget = True
            control.should_training_stop = True
            control.should_save = True  # a checkpoint with the clock, to resume or inspect
        return control

    def record(self) -> dict:
        return {"minutes": self.budget.minutes, "ended_by_budget": self.ended_by_budget}


def add_budget(budget: Budget | None, trainer: Trainer, clock: TrainingClock,
               agree_every_steps: int) -> BudgetCallback | None:
    if budget is None:
        return None
    callback = BudgetCallback(budget, clock, agree_every_steps)
    trainer.add_callback(callback)
    return callback


# ================================================================================================
# The progress bar of a run trained to a time budget (budget.minutes).
#
# Trainer's bar counts optimizer steps to trainer.max_steps, which a budget leaves as an upper
# bound only (100,000 in experiment=pretrain_budget): its estimate says hours for a run that
# ends in minutes. Under a budget, Trainer's ProgressCallback is replaced by one whose bar counts
# the budget's seconds. Without a budget, or with trainer.disable_tqdm=true (Trainer then shows
# no bar), nothing changes.

# What follows the bar: tqdm's own time, rate and estimate would be of the bar's unit (budget
# seconds per wall second, paused measurements included), so the bar says its own.
BAR_FORMAT = "{l_bar}{bar}| {spent}/{budget} budget [{left} left, step {step}, {step_rate}]"


class BudgetBar(tqdm):
    """A tqdm bar over the budget's seconds, started at the seconds already spent (a resumed
    run's); `advance` moves it to the training clock's reading after an optimizer step."""

    def __init__(self, seconds: float, elapsed: float, step: int):
        # Before tqdm's __init__, which draws the bar (format_dict) once.
        self.step, self.elapsed = step, elapsed
        self._first_step, self._first_elapsed = step, elapsed  # this session's start
        super().__init__(total=seconds, initial=min(elapsed, seconds), bar_format=BAR_FORMAT,
                         dynamic_ncols=True)

    def advance(self, elapsed: float, step: int) -> None:
        self.step, self.elapsed = step, elapsed
        self.update(min(elapsed, self.total) - self.n)  # draws at most every mininterval

    @property
    def steps_per_second(self) -> float | None:
        seconds = self.elapsed - self._first_elapsed
        return (self.step - self._first_step) / seconds if seconds > 0 else None

    @property
    def format_dict(self):
        # Computed when tqdm draws the bar, not at every step.
        rate = self.steps_per_second
        return {**super().format_dict,
                "spent": self.format_interval(self.elapsed),
                "budget": self.format_interval(self.total),
                # Rounded up: "00:00 left" only once the time is spent.
                "left": self.format_interval(math.ceil(max(self.total - self.elapsed, 0.0))),
                "step": self.step,
                "step_rate": "? steps/s" if rate is None else f"{rate:.3g} steps/s"}


class BudgetProgressCallback(ProgressCallback):
    """Trainer's ProgressCallback (its evaluation bars and log lines kept, main process only)
    with a training bar over the budget: steps done, training time spent and left, steps per
    second. It reads the time the BudgetCallback read for the step (the agreed clock under
    DDP), so it adds no clock read and no host sync; it must come after the BudgetCallback,
    whose on_train_begin reads a resumed run's carried seconds."""

    def __init__(self, budget: BudgetCallback, max_str_len: int = 100):
        super().__init__(max_str_len)
        self.budget = budget

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = BudgetBar(self.budget.budget.seconds, self.budget.elapsed,
                                          state.global_step)
        self.current_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.advance(self.budget.elapsed, state.global_step)
        self.current_step = state.global_step


def show_budget_progress(trainer: Trainer,
                         budget: BudgetCallback) -> BudgetProgressCallback | None:
    """Replaces the trainer's ProgressCallback with the budget's (added after every callback
    given so far: call it after the BudgetCallback is added); None when the trainer shows no
    such bar (disable_tqdm=true gives a PrinterCallback, a notebook its own bar)."""
    shown = next((cb for cb in callbacks_of(trainer) if isinstance(cb, ProgressCallback)), None)
    if shown is None:
        return None
    trainer.remove_callback(shown)
    callback = BudgetProgressCallback(budget, shown.max_str_len)
    trainer.add_callback(callback)
    return callback


# ================================================================================================
# When a run stops before its schedule ends, through Trainer's callbacks, from the config:
# early stopping on the dev metric, and stopping at a share of the schedule (successive halving's
# early rungs). (The finetuning methods' callbacks are in their modules,
# bertkit/finetuning/methods/.)

def add_early_stopping(settings: DictConfig, watched: str | None, trainer: Trainer) -> None:
    """early_stopping.patience (`settings`: the early_stopping node): Trainer's
    EarlyStoppingCallback on the checkpoint-selecting metric (`watched`:
    trainer.metric_for_best_model); checked here so that a missing setting is one message, not
    Trainer's assertion."""
    if settings.patience is None:
        return
    args = trainer.args
    # The config's value: TrainingArguments fills in "loss" by itself, which GLUE's evaluation
    # names eval_validation_loss, and Trainer would then turn early stopping off with a warning.
    if not watched or not args.load_best_model_at_end:
        raise BertkitError("early_stopping.patience needs trainer.metric_for_best_model (the dev "
                           "metric to watch, e.g. validation_accuracy for GLUE) and "
                           "trainer.load_best_model_at_end=true")
    if args.eval_strategy == "no":
        raise BertkitError("early_stopping.patience needs evaluations: set trainer.eval_strategy "
                           "to epoch or steps")
    trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=int(settings.patience),
                                               early_stopping_threshold=settings.threshold))


class StopAtFraction(TrainerCallback):
    """Stop (and save a checkpoint) once `fraction` of the planned optimizer steps are done.

    The schedule stays the whole run's (learning-rate decay over all planned steps), so a run
    continued with resume=true goes on exactly as if it had never stopped.
    """

    def __init__(self, fraction: float):
        self.fraction = fraction
        self.stopped = False

    def stop_step(self, max_steps: int) -> int:
        return max(1, math.ceil(self.fraction * max_steps))

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


def add_train_fraction(share, trainer: Trainer) -> StopAtFraction | None:
    """train_fraction (`share`): stop at that share of the schedule."""
    if share is None:
        return None
    if float(share) == 1.0:
        return None
    callback = StopAtFraction(float(share))
    trainer.add_callback(callback)
    return callback


# ================================================================================================
# Whether a checkpoint's files are whole, judged by their content, cheaply.
#
# On cluster filesystems (NFS, Lustre) and after a node crash, files written without fsync do
# not reach the disk in the order they were written: a checkpoint can hold a whole
# trainer_state.json beside half a model.safetensors. So no single file vouches for the
# others; each file a resume reads is checked itself, without loading tensors:
#
#     *.safetensors   the header's length, its JSON, and the tensors' last byte against the
#                     file's size
#     *.pt *.pth *.bin torch.save's zip: the central directory at the end, and every entry
#                     inside the part of the file before it (a file cut anywhere loses either)
#     *.json          parses
#
# and the files Trainer's resume needs must be there (it silently starts a fresh optimizer
# when optimizer.pt is missing, for instance).

STATE_FILE = TRAINER_STATE_NAME
# The weights Trainer saves (whole, or sharded with an index; PEFT's adapter files); FSDP's
# sharded state dict is a folder (pytorch_model_fsdp_0/).
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME,
                 ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
WEIGHTS_FOLDERS = (FSDP_MODEL_NAME,)
OPTIMIZER_FILE, SCHEDULER_FILE = OPTIMIZER_NAME, SCHEDULER_NAME
# FSDP's sharded optimizer (optimizer_0/) and DeepSpeed's state (global_step<N>/) are folders.
OPTIMIZER_FOLDERS = ("optimizer_", "global_step")
RNG_PATTERN = "rng_state*.pth"  # rng_state.pth, or rng_state_<rank>.pth under DDP
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def safetensors_fault(path: Path) -> str | None:
    """Why a safetensors file is not whole: its 8-byte header length, the JSON header, and
    the end of its last tensor against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"cut short ({size} bytes, not even the header's length)"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return f"cut short ({size} bytes; the header alone needs {8 + length})"
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError):
            return "its header is not valid JSON"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"cut short ({size} bytes; its header describes {expected})"
    return None


def torch_file_fault(path: Path) -> str | None:
    """Why a torch.save file is not whole: a zip archive whose central directory (the last
    bytes written) reads back and whose entries all lie before it."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            directory_start = archive.start_dir
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return f"cut short (not a whole torch.save archive; {path.stat().st_size} bytes)"
    for entry in entries:
        if entry.header_offset + entry.compress_size > directory_start:
            return f"cut short (entry {entry.filename} runs past the archive's directory)"
    return None


def json_fault(path: Path) -> str | None:
    try:
        read_json(path, expect=object)
    except DamagedFile:
        return "cut short (not valid JSON)"
    return None


def file_fault(path: Path) -> str | None:
    """Why one checkpoint file is not whole, by its kind; None when whole or of a kind not
    checked (a tokenizer's vocab.txt)."""
    if path.name.endswith(".safetensors"):
        return safetensors_fault(path)
    if path.name.endswith(TORCH_SUFFIXES):
        return torch_file_fault(path)
    if path.name.endswith(".json"):
        return json_fault(path)
    return None


def missing_files(folder: Path, *, weights_only: bool = False) -> list[str]:
    """The files Trainer's resume reads that `folder` lacks (weights_only: a checkpoint saved
    with trainer.save_only_model holds no optimizer, scheduler or RNG state)."""
    names = {path.name for path in folder.iterdir()}
    has_folder = lambda prefixes: any(  # noqa: E731 - one line, used twice
        name.startswith(prefixes) and (folder / name).is_dir() for name in names)
    missing = [] if STATE_FILE in names else [STATE_FILE]
    if not names.intersection(WEIGHTS_FILES) and not has_folder(WEIGHTS_FOLDERS):
        missing.append(f"weights ({SAFE_WEIGHTS_NAME})")
    if weights_only:
        return missing
    if OPTIMIZER_FILE not in names and not has_folder(OPTIMIZER_FOLDERS):
        missing.append(OPTIMIZER_FILE)
    if SCHEDULER_FILE not in names:
        missing.append(SCHEDULER_FILE)
    if not any(folder.glob(RNG_PATTERN)):
        missing.append("rng_state.pth (nor any rng_state_<rank>.pth)")
    return missing


def index_shards(folder: Path) -> list[str]:
    """The shard files a sharded weights index names."""
    shards = set()
    for index in folder.glob("*.index.json"):
        try:
            shards.update(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            continue  # the index's own fault is told by file_fault
    return sorted(shards)


def checkpoint_fault(folder: Path, *, weights_only: bool = False) -> str | None:
    """Why `folder` cannot be resumed from, naming the file; None when every file it holds
    is whole and none that the resume reads is missing."""
    missing = missing_files(folder, weights_only=weights_only)
    missing += [shard for shard in index_shards(folder) if not (folder / shard).is_file()]
    if missing:
        return f"no {', no '.join(missing)} (the save was cut short)"
    for path in sorted(folder.iterdir()):
        if path.is_file():
            why = file_fault(path)
            if why is not None:
                return f"{path.name} is {why}"
    return None


# ================================================================================================
# The checkpoint a run resumes from: the newest whole one.
#
# A job killed while Trainer writes a checkpoint (preemption during a save is ordinary on a
# cluster: BERT-large's weights and optimizer state take seconds to write) leaves a folder with
# some of its files, the last one cut short; after a node crash, or on NFS and Lustre, any of
# them may be cut, whatever order they were written in. transformers' get_last_checkpoint takes
# the newest folder whatever it holds, and resuming from a torn one ends in a safetensors or
# FileNotFoundError traceback although a whole checkpoint lies beside it. So each checkpoint is
# judged by the content of the files the resume reads (checkpoint_fault, above), and
# bertkit fsyncs a checkpoint's files once Trainer has saved them
# (DurableCheckpoints, below).


_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


@dataclass
class CheckpointScan:
    """The newest complete checkpoint (None: none is), and each newer one skipped with why."""

    complete: Path | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def describe_skipped(self) -> str:
        return "; ".join(f"{folder.name}: {why}" for folder, why in self.skipped)


def checkpoint_step(folder: Path) -> int | None:
    match = _CHECKPOINT.match(folder.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The checkpoint-N folders of output_dir, by step ([] when it does not exist)."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    return sorted((path for path in directory.iterdir()
                   if checkpoint_step(path) is not None and path.is_dir()), key=checkpoint_step)


def scan_checkpoints(output_dir: str | Path, *, weights_only: bool = False) -> CheckpointScan:
    """Checkpoints from the newest step down to the first whole one (weights_only: the run
    saves with trainer.save_only_model, without optimizer, scheduler and RNG states)."""
    scan = CheckpointScan(None)
    for folder in reversed(checkpoint_folders(output_dir)):
        why = checkpoint_fault(folder, weights_only=weights_only)
        if why is None:
            scan.complete = folder
            break
        scan.skipped.append((folder, why))
    return scan


# ================================================================================================
# A checkpoint counts as saved once its files are on the disk, not in the page cache.
#
# Trainer writes a checkpoint's files without fsync; after a node crash, or on NFS and Lustre,
# some may never reach the disk, or reach it cut short, whatever their order. Once Trainer has
# saved (on_save), each process fsyncs the checkpoint's files and the folders that name them
# (the checkpoint's own and the one holding it), so a checkpoint that a resume finds is whole
# unless the machine died during this very save; checkpoint_fault judges the
# rest by content. One fsync per file, after a save that wrote them anyway: the cost is the
# time the disk takes to hold what Trainer wrote. fsync_checkpoints=false turns it off
# (conf/config.yaml).

def fsync_path(path: Path) -> bool:
    """fsync one file or folder (a folder's entries: the names of the files in it); False for
    one gone since the folder was listed. Under DDP every process fsyncs the checkpoint while
    the main process may still be writing a file of its own into it atomically (its training
    clock: a temporary file renamed into place), so a name listed a moment ago may be gone:
    the process that wrote it fsyncs it."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    except OSError as err:  # some filesystems refuse fsync on a folder (EINVAL)
        logger.debug("fsync %s: %s", path, err)
    finally:
        os.close(fd)
    return True


def fsync_tree(folder: Path) -> int:
    """fsync every file under `folder`, then each folder (deepest first) and `folder`'s
    parent; returns how many files."""
    files = 0
    for root, _, names in os.walk(folder, topdown=False):
        for name in names:
            files += fsync_path(Path(root) / name)
        fsync_path(Path(root))
    fsync_path(folder.parent)
    return files


class DurableCheckpoints(TrainerCallback):
    """fsyncs each checkpoint as soon as Trainer has written it."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            logger.debug("fsynced %d files of %s", fsync_tree(folder), folder)
        return control


# ================================================================================================
# Preemption: a signal stops the run at the end of the current step, with a checkpoint.
#
# SLURM and most schedulers send SIGTERM some seconds before they kill a preempted job; a
# submitit job gets its own signal (USR2 by default: SUBMITIT_PREEMPT_SIGNAL), on which submitit
# requeues the job and exits at once, losing everything since the last periodic checkpoint.
# Here the signal only raises a flag. At the end of an optimizer step Trainer saves a
# checkpoint and stops (every process of a distributed run at the same step: the flag is
# reduced over them every `agree_every_steps` steps), then the job ends with Preempted: exit
# status 128 + the signal for a
# plain job; for submitit, its own handler runs now (checkpoint/requeue), and the requeued job
# continues from that checkpoint with resume=auto.
#
# Ctrl-C (SIGINT) is handled the same way: the run saves at the step's end and stops, exit
# status 130, with the command that resumes it. A second Ctrl-C stops at once: the first one
# puts Python's own handler back, whose KeyboardInterrupt the CLI tells in one line (a user who
# presses it twice does not want to wait for the step). A process that ignores SIGINT (started
# in the background by a non-interactive shell) keeps ignoring it.
#
# The grace period may be 30 s for everything, so after the signal the run does nothing a
# resume does not need: callbacks that score (the held-out evaluation) ask `preempting` and
# skip, and Trainer's end of training neither loads the best checkpoint back (the process
# exits) nor, under save_total_limit=1, deletes the checkpoint just saved as not the best; no
# metrics.json, model or card is written after it (Preempted unwinds the job).

SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


class Preempted(Exception):
    """The run saved a checkpoint and stopped on a preemption signal."""

    def __init__(self, signum: int, step: int, checkpoint_dir: str, handler=None):
        self.signum, self.step, self.handler = signum, step, handler
        self.checkpoint = f"{checkpoint_dir}/{PREFIX_CHECKPOINT_DIR}-{step}"
        stopped = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                   else f"preempted by {signal.Signals(signum).name}")
        self.stopped = f"{stopped} at step {step}: checkpoint saved in {self.checkpoint}"
        super().__init__(f"{self.stopped}; the same command with resume=auto continues from it")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def hand_over(self) -> None:
        """Runs the handler the signal had before the run (submitit's checkpoint/requeue,
        which exits), if it had one; not Ctrl-C's (Python's raises KeyboardInterrupt)."""
        if self.signum != signal.SIGINT and callable(self.handler):
            self.handler(self.signum, None)


def preemption_signals() -> list[int]:
    """SIGTERM, SIGINT (Ctrl-C) unless the process ignores it, and submitit's preemption
    signal inside a submitit job."""
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signals.append(signal.SIGINT)
    if os.environ.get("SUBMITIT_JOB_ID") or os.environ.get(SUBMITIT_SIGNAL_ENV):
        name = os.environ.get(SUBMITIT_SIGNAL_ENV, "USR2").upper().removeprefix("SIG")
        submitit = getattr(signal, f"SIG{name}", None)
        if submitit is not None and submitit not in signals:
            signals.append(submitit)
    return signals


class PreemptionCallback(TrainerCallback):
    """Catches the preemption signals during training; saves and stops at the step's end."""

    def __init__(self, agree_every_steps: int, signals: list[int] | None = None):
        """agree_every_steps: under DDP, the processes compare their flags at every this many
        optimizer steps (one collective each time, not one per step)."""
        self.signals = preemption_signals() if signals is None else signals
        self.agree_every_steps = max(1, int(agree_every_steps))
        self.received: int | None = None
        self.stopped_at: int | None = None
        self.previous: dict[int, object] = {}

    def _catch(self, signum, frame):
        if signum == signal.SIGINT:
            # The next Ctrl-C raises KeyboardInterrupt at once (Python's own handler).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            logger.warning("caught Ctrl-C: saving a checkpoint at the end of this step, then "
                           "stopping (Ctrl-C again stops at once, without it)")
        else:
            logger.warning("caught %s: saving a checkpoint at the end of this step, then "
                           "stopping", signal.Signals(signum).name)
        if self.received is None:
            self.received = signum

    def on_train_begin(self, args, state, control, **kwargs):
        # Python runs signal handlers in the main thread only (a run in a worker thread, as
        # some launchers do, keeps the default behaviour).
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self.previous[signum] = signal.signal(signum, self._catch)

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_process_received(state.global_step):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step:
            # Saved in this checkpoint's trainer_state.json, where the resume reads it; in
            # memory it would make Trainer's end of training load the best model back, and
            # under save_total_limit=1 delete this checkpoint as not the best.
            state.best_model_checkpoint = None

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """The handlers from before training. Also called when training raises (on_train_end
        never runs then): a handler left behind would outlive the run, and a process forked
        later (a datasets worker pool) would ignore the SIGTERM that ends it."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _any_process_received(self, step: int) -> bool:
        """Every process stops at the same step: the schedulers signal them at different
        moments, and a process that saved alone would wait for the others forever. They agree
        at every agree_every_steps-th step only: a collective and its read-back stop the host
        until the GPU drains, and a scheduler's grace period spans many steps."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.received is not None
        if step % self.agree_every_steps:
            return False
        flag = torch.tensor([0 if self.received is None else self.received], dtype=torch.int64)
        if torch.distributed.get_backend() == "nccl":
            flag = flag.cuda()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = int(flag.item())
        return bool(flag.item())

    def raise_if_stopped(self, checkpoint_dir: str) -> None:
        """After Trainer.train returned: Preempted when a signal stopped it."""
        if self.stopped_at is not None:
            raise Preempted(self.received, self.stopped_at, checkpoint_dir,
                            self.previous.get(self.received))


class ResumedFrom(TrainerCallback):
    """Says in one line where a resumed run goes on from: the checkpoint, its step, and the
    steps the run plans (Trainer's own lines say it only at debug level)."""

    def __init__(self, checkpoint: str | None):
        self.checkpoint = checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        if self.checkpoint is not None and state.is_world_process_zero:
            logger.info("resumed from %s: step %d of %d", self.checkpoint, state.global_step,
                        state.max_steps)
        return control


def preempting(trainer) -> bool:
    """Whether a preemption signal has reached `trainer`'s run: slow work it would do now
    (scoring) is not what a resume needs, and the grace period is short."""
    return any(isinstance(callback, PreemptionCallback) and callback.received is not None
               for callback in callbacks_of(trainer))


# ================================================================================================
# overwrite=true: the earlier run is set aside, then removed once the new run has started.
#
# An overwritten run must leave nothing that a later step reads: its checkpoints above all
# (resume=auto after a preemption, or resume=true, would continue the old run's newest one),
# but also its predictions, model, metrics, card and W&B run files. Deleting it before the new
# run starts would lose it to a new run that fails at once (a mistyped data path), so every
# entry of the run directory is moved into a hidden folder beside it, named on stderr or in
# the log, and that folder is removed once the new run has started: when its training begins
# (its data read and its model built: RemoveSetAsideRun, on the main process), or, for a job
# that trains nothing in this process (a benchmark), when it has finished. A run that fails
# before that leaves the folder where the line said.

SET_ASIDE_NAME = ".{name}.overwritten-"  # the folder's prefix, beside the run directory
_set_aside: ContextVar[Path | None] = ContextVar("bertkit_set_aside", default=None)


def set_aside(run_dir: Path, keep: Iterable[str] = ()) -> Path | None:
    """Moves every entry of run_dir but `keep` (the names a sweep job's Hydra has just written)
    into a new hidden folder beside it, remembered for remove_set_aside; returns the folder
    (None: nothing to move). Checkpoints go first and result files last, so that another
    process of the launch that looks meanwhile never sees the old checkpoints without the
    result file that makes them a finished run's."""
    run_dir = Path(run_dir)
    entries = [path for path in run_dir.iterdir() if path.name not in set(keep)] \
        if run_dir.is_dir() else []
    if not entries:
        return None
    folder = Path(tempfile.mkdtemp(prefix=SET_ASIDE_NAME.format(name=run_dir.name),
                                   dir=run_dir.parent))
    for path in sorted(entries, key=lambda path: (not path.is_dir(), path.name)):
        os.replace(path, folder / path.name)
    _set_aside.set(folder)
    return folder


def remove_set_aside() -> None:
    """The new run has started: the run set aside for it is removed."""
    folder = _set_aside.get()
    if folder is None:
        return
    _set_aside.set(None)
    shutil.rmtree(folder, ignore_errors=True)
    logger.info("overwrite=true: removed the earlier run set aside in %s", folder)


def forget_set_aside() -> Path | None:
    """The new run failed before it started: the folder stays (the line that set it aside
    named it) and is no longer this process's to remove; returns it."""
    folder = _set_aside.get()
    _set_aside.set(None)
    return folder


class RemoveSetAsideRun(TrainerCallback):
    """Removes the overwritten run set aside for this one once its training begins."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            remove_set_aside()
        return control

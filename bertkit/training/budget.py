"""How long a run trains and when it stops: the training clock kept across resumes, the
time budget (budget.minutes) with its learning-rate schedule and progress bar, early stopping
and stopping at a share of the schedule. One module because they all answer "stop now?" from
the same clock and the same Trainer callbacks.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm
from transformers import EarlyStoppingCallback, ProgressCallback, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from bertkit.config_schema import DECAYS
from bertkit.data.atomic_files import write_json_atomic
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

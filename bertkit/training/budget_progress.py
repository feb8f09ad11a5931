"""The progress bar of a run trained to a time budget (budget.minutes).

Trainer's bar counts optimizer steps to trainer.max_steps, which a budget leaves as an upper
bound only (100,000 in experiment=pretrain_budget): its estimate says hours for a run that
ends in minutes. Under a budget, Trainer's ProgressCallback is replaced by one whose bar counts
the budget's seconds. Without a budget, or with trainer.disable_tqdm=true (Trainer then shows
no bar), nothing changes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tqdm import tqdm
from transformers import ProgressCallback, Trainer

from bertkit.trainer_internals import callbacks_of

if TYPE_CHECKING:
    from bertkit.training.budget import BudgetCallback

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

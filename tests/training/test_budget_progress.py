"""The progress bar under a time budget counts the budget's seconds (and a resumed run's
carried ones), not trainer.max_steps; without a budget, or with disable_tqdm, Trainer's own
callbacks stay as they are."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from transformers import PrinterCallback, ProgressCallback

import bertkit.training.run as lifecycle
import bertkit.training.stop_and_resume as budget_progress
from bertkit.jobs import run_job
from bertkit.training.stop_and_resume import (
    Budget,
    BudgetBar,
    BudgetCallback,
    BudgetProgressCallback,
)
from bertkit.training.trainer import callbacks_of
from tests.conftest import compose_config, tiny_run_overrides
from tests.training.test_time_budget import budget_overrides, fake_clock  # noqa: F401 (fixture)


@pytest.fixture
def seen(monkeypatch):
    """The trainer each run trains, and every budget bar drawn."""
    found = {"trainers": [], "bars": []}
    train = lifecycle._train_or_explain

    def keeping(trainer, checkpoint):
        found["trainers"].append(trainer)
        return train(trainer, checkpoint)

    class KeptBar(BudgetBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            found["bars"].append(self)

    monkeypatch.setattr(lifecycle, "_train_or_explain", keeping)
    monkeypatch.setattr(budget_progress, "BudgetBar", KeptBar)
    return found


def kinds(trainer) -> list[type]:
    return [type(callback) for callback in callbacks_of(trainer)]


@pytest.mark.slow
def test_the_demo_on_a_budget_shows_progress_against_the_budget(seen, tmp_path, capsys):
    cfg = compose_config(["logger=none", "budget.minutes=0.02", "trainer.save_strategy=no",
                          "trainer.eval_strategy=no", "model.config.hidden_size=32",
                          "model.config.intermediate_size=64", "trainer.disable_tqdm=false"])
    record = run_job(cfg, run_dir=tmp_path / "run")
    train = record["train"]
    assert train["budget"] == {"minutes": 0.02, "ended_by_budget": True}
    assert train["planned_steps"] > train["steps"]  # max_steps: only an upper bound here
    [bar] = seen["bars"]
    # Its total is the budget's 1.2 s, it ended full at the step the budget stopped.
    assert bar.total == pytest.approx(1.2) and bar.n == pytest.approx(1.2)
    assert bar.step == train["steps"] and bar.elapsed >= 1.2
    stderr = capsys.readouterr().err
    # The last step may end past the budget: the time spent says so, the bar stays full.
    assert re.search(r"100%\|[^|\n\r]*\| \d\d:\d\d/00:01 budget \[00:00 left, step "
                     rf"{train['steps']}, [\d.]+ steps/s\]", stderr), stderr[-2000:]
    assert f"/{train['planned_steps']} [" not in stderr  # no bar counted to max_steps
    # The evaluation bars (validation, test predictions) still run to their end.
    assert re.search(r"100%\|[^|\n\r]*\| (\d+)/\1 \[", stderr), stderr[-2000:]
    [trainer] = seen["trainers"]
    order = kinds(trainer)
    assert ProgressCallback not in order and order.count(BudgetProgressCallback) == 1
    assert order.index(BudgetCallback) < order.index(BudgetProgressCallback)


@pytest.mark.slow
def test_a_resumed_run_starts_its_bar_at_the_time_already_spent(fake_clock, seen,  # noqa: F811
                                                                 glue_dir, vocab_dir, tmp_path):
    data = glue_dir("mrpc", n_train=48)
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides("mrpc", data, vocab_dir, **{
        "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.disable_tqdm": False, **budget_overrides(1.0)})
    # 6 fake seconds a step: max_steps=4 ends the first run at 24 s of the 60.
    run_job(compose_config(overrides), run_dir=run_dir)
    run_job(compose_config(overrides + ["resume=true", "trainer.max_steps=100"]),
            run_dir=run_dir)
    first, second = seen["bars"]
    assert (first.initial, first.n, first.step) == (0, 24.0, 4)
    assert (second.total, second.initial, second.n, second.step) == (60.0, 24.0, 60.0, 10)
    assert second.steps_per_second == pytest.approx(1 / 6)  # this session's 6 steps in 36 s


@pytest.mark.slow  # a run per case
@pytest.mark.parametrize("budget,quiet,shown", [
    (None, False, ProgressCallback),
    (1.0, True, PrinterCallback),
    (None, True, PrinterCallback),
], ids=["no-budget", "budget-disable-tqdm", "disable-tqdm"])
def test_without_a_budget_or_a_bar_trainer_keeps_its_own(budget, quiet, shown, seen, glue_dir,
                                                         vocab_dir, tmp_path, capsys):
    settings = {} if budget is None else {"budget.minutes": budget}
    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "trainer.disable_tqdm": quiet, **settings})
    run_job(compose_config(overrides), run_dir=tmp_path / "run")
    [trainer] = seen["trainers"]
    order = kinds(trainer)
    assert shown in order and BudgetProgressCallback not in order and not seen["bars"]
    if shown is PrinterCallback:
        assert ProgressCallback not in order
    assert " budget [" not in capsys.readouterr().err


def test_the_bar_follows_the_budgets_reading_on_the_main_process_only():
    budget = SimpleNamespace(budget=Budget(1.0, 0.0, "linear", 0.0), elapsed=24.0)
    callback = BudgetProgressCallback(budget)
    main = SimpleNamespace(is_world_process_zero=True, global_step=4)
    callback.on_train_begin(None, main, None)
    bar = callback.training_bar
    assert (bar.total, bar.n) == (60.0, 24.0)
    budget.elapsed, main.global_step = 36.0, 6
    callback.on_step_end(None, main, None)
    assert bar.n == 36.0
    assert str(bar).endswith("| 00:36/01:00 budget [00:24 left, step 6, 0.167 steps/s]")
    budget.elapsed, main.global_step = 61.5, 7  # the step past the budget: the bar is full
    callback.on_step_end(None, main, None)
    assert bar.n == 60.0 and "[00:00 left, step 7," in str(bar)
    callback.on_train_end(None, main, None)
    assert callback.training_bar is None

    other = BudgetProgressCallback(budget)
    rank1 = SimpleNamespace(is_world_process_zero=False, global_step=4)
    other.on_train_begin(None, rank1, None)
    other.on_step_end(None, rank1, None)
    assert other.training_bar is None

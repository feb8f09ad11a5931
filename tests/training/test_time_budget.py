"""Training to a time budget: the learning rate is a function of the elapsed training time
(warm-up, then the decay), the run stops at the first step past the budget with a checkpoint
holding the clock, a resumed run counts the time already spent (paused time not), for
pretraining and finetuning alike. Time is a fake clock that moves a fixed number of seconds per
training step."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer

import bertkit.training.run as run_module
from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.pretraining.run import pretrain
from bertkit.training.stop_and_resume import (
    CLOCK_FILE,
    Budget,
    BudgetCallback,
    TrainingClock,
    budget_multiplier,
    carried_seconds,
)
from tests.conftest import compose_config, refusal, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import small_run

STEP_SECONDS = 6.0  # fake training time per optimizer step (no gradient accumulation here)
LEARNING_RATE = 1e-3


class FakeTime:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    """Every run's clock reads a fake time that moves STEP_SECONDS per training step; a step
    listed in `measured_at` (global step numbers, 1-based) also spends `measure_seconds`
    inside clock.paused(), as a held-out measurement would."""
    fake = SimpleNamespace(time=FakeTime(), clocks=[], measured_at=set(), measure_seconds=100.0)

    def new_clock() -> TrainingClock:
        fake.clocks.append(TrainingClock(time_fn=fake.time))
        return fake.clocks[-1]

    original = Trainer.training_step

    def training_step(self, *args, **kwargs):
        fake.time.now += STEP_SECONDS
        if self.state.global_step + 1 in fake.measured_at:
            with fake.clocks[-1].paused():
                fake.time.now += fake.measure_seconds
        return original(self, *args, **kwargs)

    monkeypatch.setattr(run_module, "training_clock", new_clock)
    monkeypatch.setattr(Trainer, "training_step", training_step)
    return fake


def expected_rate(elapsed: float, budget_seconds: float, warmup: float, decay: str,
                  floor: float) -> float:
    """The schedule written out independently of bertkit.training.stop_and_resume."""
    f = elapsed / budget_seconds
    if f >= 1:
        return LEARNING_RATE * floor
    if f < warmup:
        return LEARNING_RATE * f / warmup
    progress = (f - warmup) / (1 - warmup)
    shape = {"linear": 1 - progress, "cosine": (1 + math.cos(math.pi * progress)) / 2,
             "constant": 1.0}[decay]
    return LEARNING_RATE * (floor + (1 - floor) * shape)


def training_logs(checkpoint) -> list[dict]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [line for line in state["log_history"] if "loss" in line]


def budget_overrides(minutes, warmup=0.0, decay="linear", floor=0.0) -> dict:
    """The budget's keys; the finished run keeps its checkpoints (the tests read the clock and
    the log history in them, and train some of them on with a longer budget)."""
    return {"budget.minutes": minutes, "budget.warmup_fraction": warmup, "budget.decay": decay,
            "budget.min_lr_ratio": floor, "keep_checkpoints": True}


@pytest.mark.parametrize("fraction,warmup,decay,floor,value", [
    (0.0, 0.2, "linear", 0.0, 0.0),
    (0.1, 0.2, "linear", 0.0, 0.5),
    (0.2, 0.2, "linear", 0.0, 1.0),
    (0.6, 0.2, "linear", 0.0, 0.5),
    (0.6, 0.2, "linear", 0.2, 0.6),
    (1.0, 0.2, "linear", 0.0, 0.0),
    (1.5, 0.2, "linear", 0.1, 0.1),
    (0.0, 0.0, "cosine", 0.0, 1.0),
    (0.5, 0.0, "cosine", 0.0, 0.5),
    (0.75, 0.5, "cosine", 0.1, 0.55),
    (1.0, 0.0, "cosine", 0.1, 0.1),
    (0.125, 0.25, "constant", 0.0, 0.5),
    (0.5, 0.25, "constant", 0.0, 1.0),
    (0.99, 0.25, "constant", 0.3, 1.0),
])
def test_the_schedule_is_a_function_of_the_elapsed_share(fraction, warmup, decay, floor, value):
    assert budget_multiplier(fraction, warmup, decay, floor) == pytest.approx(value)


@pytest.mark.slow  # a pretraining run
def test_pretraining_follows_the_time_schedule_and_stops_at_the_budget(fake_clock, tmp_path):
    run_dir = tmp_path / "run"
    minutes, warmup, decay, floor = 1.0, 0.25, "cosine", 0.1
    # Without the held-out evaluations: their log lines are not what this test is about.
    record = pretrain(compose_config(small_run(**{
        "trainer.max_steps": 100, "trainer.learning_rate": LEARNING_RATE, "heldout.fraction": 0,
        **budget_overrides(minutes, warmup, decay, floor)})), run_dir)
    # 6 s a step: the first step at or past 60 s is the 10th (60 s); max_steps=100 is only a
    # bound. save_strategy=no, yet the budget's end leaves a checkpoint with the clock.
    assert record["train"]["steps"] == 10
    assert record["train"]["training_seconds"] == 60.0
    assert record["train"]["budget"] == {"minutes": 1.0, "ended_by_budget": True}
    checkpoint = run_dir / "checkpoints" / "checkpoint-10"
    assert json.loads((checkpoint / CLOCK_FILE).read_text()) == {"seconds": 60.0}
    assert {key: value for key, value in record["hyperparameters"].items()
            if key.startswith("budget_")} == {
        "budget_minutes": 1.0, "budget_warmup_fraction": 0.25, "budget_decay": "cosine",
        "budget_min_lr_ratio": 0.1}
    # Step k steps with the rate the scheduler set at the end of step k - 1 (the first at 0 s),
    # which is what Trainer logs as the step's learning_rate.
    logs = training_logs(checkpoint)
    assert [line["step"] for line in logs] == list(range(1, 11))
    for line in logs:
        elapsed = (line["step"] - 1) * STEP_SECONDS
        assert line["learning_rate"] == pytest.approx(
            expected_rate(elapsed, 60.0, warmup, decay, floor), rel=1e-9, abs=1e-15), line
    assert json.loads((run_dir / "metrics.json").read_text())["train"]["budget"][
        "ended_by_budget"] is True


@pytest.mark.slow
def test_a_resumed_run_counts_the_time_already_spent(fake_clock, glue_dir, vocab_dir,
                                                      tmp_path):
    data = glue_dir("mrpc", n_train=48)
    run_dir = tmp_path / "run"
    schedule = budget_overrides(1.0, warmup=0.2, decay="linear")
    overrides = tiny_run_overrides("mrpc", data, vocab_dir, **{
        "trainer.save_strategy": "steps", "trainer.save_steps": 2, **schedule})
    # The first run is cut by its max_steps bound at 4 x 6 s = 24 s, before the budget.
    first = run_job(compose_config(overrides), run_dir=run_dir)
    assert first["train"]["steps"] == 4 and first["train"]["training_seconds"] == 24.0
    assert first["train"]["budget"] == {"minutes": 1.0, "ended_by_budget": False}
    assert carried_seconds(str(run_dir / "checkpoints" / "checkpoint-4")) == 24.0

    # Resumed without the bound: it starts at 24 s and ends at the same 60 s in all, at step
    # 10; a 100 s measurement inside clock.paused() during step 7 is not training time.
    fake_clock.measured_at = {7}
    second = run_job(compose_config(overrides + ["resume=true", "trainer.max_steps=100"]),
                     run_dir=run_dir)
    assert second["train"]["steps"] == 10 and second["train"]["training_seconds"] == 60.0
    assert second["train"]["budget"] == {"minutes": 1.0, "ended_by_budget": True}
    checkpoint = run_dir / "checkpoints" / "checkpoint-10"
    assert carried_seconds(str(checkpoint)) == 60.0
    resumed = [line for line in training_logs(checkpoint) if line["step"] > 4]
    assert [line["step"] for line in resumed] == list(range(5, 11))
    # Right after the resume the rate is the schedule's at the carried 24 s, and on from there.
    for line in resumed:
        assert line["learning_rate"] == pytest.approx(
            expected_rate((line["step"] - 1) * STEP_SECONDS, 60.0, 0.2, "linear", 0.0),
            rel=1e-9, abs=1e-15), line


@pytest.mark.slow  # a run
def test_a_finetune_stops_by_time_and_keeps_its_layerwise_rates(fake_clock, glue_dir,
                                                                vocab_dir, tmp_path):
    run_dir = tmp_path / "run"
    record = run_job(compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        "trainer.max_steps": 100, "finetuning": "llrd", "finetuning.layer_lr_decay": 0.5,
        **budget_overrides(0.5, decay="linear")})), run_dir=run_dir)
    assert record["train"]["steps"] == 5  # 5 x 6 s = 30 s
    assert record["train"]["budget"] == {"minutes": 0.5, "ended_by_budget": True}
    logs = training_logs(run_dir / "checkpoints" / "checkpoint-5")
    for line in logs:
        top = expected_rate((line["step"] - 1) * STEP_SECONDS, 30.0, 0.0, "linear", 0.0)
        assert line["learning_rate"] == pytest.approx(top, rel=1e-9), line
        # Each group keeps its own share of the peak (scratch_tiny: 2 layers).
        assert line["lr/head"] == pytest.approx(top, rel=1e-9)
        assert line["lr/layer_0"] == pytest.approx(top * 0.5, rel=1e-9)
        assert line["lr/embeddings"] == pytest.approx(top * 0.25, rel=1e-9)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_process_stops_at_the_same_step(glue_dir, vocab_dir, tmp_path):
    """Process 0's clock decides for all (a process stopping alone would leave the others
    waiting in the next step's gradient all-reduce): a real 1.2 s budget on 2 CPU processes."""
    data = glue_dir("stsb", n_train=40)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "bertkit",
               *tiny_run_overrides("stsb", data, vocab_dir, **{
                   "trainer.max_steps": 5000, "trainer.per_device_train_batch_size": 4,
                   "trainer.per_device_eval_batch_size": 4, **budget_overrides(0.02)}),
               f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    train = json.loads((tmp_path / "run" / "metrics.json").read_text())["train"]
    assert train["budget"] == {"minutes": 0.02, "ended_by_budget": True}
    assert 0 < train["steps"] < 5000 and train["training_seconds"] >= 1.2
    saved = tmp_path / "run" / "checkpoints" / f"checkpoint-{train['steps']}"
    assert carried_seconds(str(saved)) >= 1.2


@pytest.mark.slow  # a run
def test_a_run_without_a_budget_records_its_training_time(fake_clock, glue_dir, vocab_dir,
                                                          tmp_path):
    record = run_job(compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir)),
                     run_dir=tmp_path / "run")
    assert record["train"]["steps"] == 4 and record["train"]["training_seconds"] == 24.0
    assert "budget" not in record["train"]
    assert not any(key.startswith("budget_") for key in record["hyperparameters"])


@pytest.mark.parametrize("key,value,message", [
    ("budget.minutes", 0, r"budget.minutes=0.0: expected a positive number"),
    ("budget.minutes", "soon", r"budget.minutes='soon': expected a positive number"),
    ("budget.warmup_fraction", 1.0, r"budget.warmup_fraction=1.0: expected a share"),
    ("budget.warmup_fraction", -0.1, r"budget.warmup_fraction=-0.1: expected a share"),
    ("budget.decay", "step", r"budget.decay='step': expected one of linear, cosine, constant"),
    ("budget.min_lr_ratio", 1.5, r"budget.min_lr_ratio=1.5: expected a share"),
    ("train_fraction", 0.5, r"budget.minutes with train_fraction"),
])
def test_bad_budget_settings_are_refused_before_any_data_is_read(key, value, message, glue_dir,
                                                                  vocab_dir, tmp_path):
    settings = {"budget.minutes": 1.0, key: value, "cache_dir": tmp_path / "cache"}
    refused = refusal(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **settings),
                      lambda cfg: run_job(cfg, run_dir=tmp_path / "run"))
    assert re.search(message, refused), refused
    assert not (tmp_path / "cache").exists()


def test_a_schedule_that_is_no_lambda_is_refused(tmp_path):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    callback = BudgetCallback(Budget(1.0, 0.0, "linear", 0.0), TrainingClock(), 1)
    args = SimpleNamespace(lr_scheduler_type="step", world_size=1)
    with pytest.raises(BertkitError, match=r"budget.minutes needs one of Trainer's step "
                                           r"schedules .* gives StepLR"):
        callback.on_train_begin(args, None, None, lr_scheduler=scheduler)


def test_a_checkpoint_without_the_clock_carries_nothing(tmp_path):
    assert carried_seconds(None) == 0.0
    assert carried_seconds(str(tmp_path)) == 0.0


def test_under_ddp_processes_agree_on_the_clock_every_n_steps_only(monkeypatch):
    """A broadcast of process 0's clock waits for the GPU: the budget takes one every
    agree_every_steps steps and extrapolates between them, the same arithmetic on every
    process, so the rate and the stop agree without a collective per step."""
    import bertkit.training.stop_and_resume as budget_module

    time = FakeTime()
    clock = TrainingClock(time_fn=time)
    clock.start()
    broadcasts = []

    def agreed(seconds, args):
        broadcasts.append(seconds)
        return seconds

    monkeypatch.setattr(budget_module, "agreed_seconds", agreed)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    callback = BudgetCallback(Budget(1.0, 0.0, "linear", 0.0), clock, agree_every_steps=10)
    args = SimpleNamespace(world_size=2)
    readings = []
    for step in range(1, 26):
        time.now += 2.0  # a steady 2 s a step
        callback._read_clock(args, step)
        readings.append(callback.elapsed)
    assert len(broadcasts) == 4  # steps 1 and 2 (a first rate), 10 and 20
    assert readings == pytest.approx([2.0 * step for step in range(1, 26)])

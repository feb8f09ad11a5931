"""Preemption and kills: SIGTERM saves a checkpoint at the step's end and exits 143; a run
killed with SIGKILL at random moments (some during a save), resumed each time with
resume=auto, ends with the uninterrupted run's weights and dev scores."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from bertkit.training.stop_and_resume import (
    Preempted,
    PreemptionCallback,
    preemption_signals,
    scan_checkpoints,
)
from tests.conftest import tiny_run_overrides

# The unit: the signal only raises a flag; the step's end saves and stops.


def test_a_signal_stops_the_run_at_the_end_of_the_step_with_a_checkpoint():
    handed_over = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handed_over.append(signum))
    try:
        callback = PreemptionCallback(1, signals=[signal.SIGUSR1])
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        state = SimpleNamespace(global_step=7)
        callback.on_train_begin(None, state, control)
        callback.on_step_end(None, state, control)
        assert not control.should_save and not control.should_training_stop
        callback.raise_if_stopped("out")  # nothing received: no Preempted
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handed_over == []  # caught by the run, not by the handler before it
        callback.on_step_end(None, state, control)
        assert control.should_save and control.should_training_stop
        callback.on_train_end(None, state, control)
        with pytest.raises(Preempted, match=r"preempted by SIGUSR1 at step 7: checkpoint saved "
                                            r"in out/checkpoint-7; the same command with "
                                            r"resume=auto") as err:
            callback.raise_if_stopped("out")
        assert err.value.exit_status == 128 + signal.SIGUSR1
        err.value.hand_over()  # submitit's checkpoint/requeue would run here
        assert handed_over == [signal.SIGUSR1]
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler before the run is back
        assert handed_over == [signal.SIGUSR1] * 2
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_submitit_job_also_watches_submitits_preemption_signal(monkeypatch):
    monkeypatch.delenv("SUBMITIT_JOB_ID", raising=False)
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)

    def watched():  # Ctrl-C's SIGINT aside (tests/training/test_interrupts.py)
        return [signum for signum in preemption_signals() if signum != signal.SIGINT]

    assert watched() == [signal.SIGTERM]
    monkeypatch.setenv("SUBMITIT_JOB_ID", "42")
    assert watched() == [signal.SIGTERM, signal.SIGUSR2]
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert watched() == [signal.SIGTERM, signal.SIGUSR1]


# Real signals on real runs (the bertkit command in a child process)


def command(overrides: list[str], run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bertkit", *overrides, *extra, f"hydra.run.dir={run_dir}"]


def child_env() -> dict:
    # One thread: the runs compared must add up their sums in the same order.
    return {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def run_to_end(overrides, run_dir, *extra) -> None:
    result = subprocess.run(command(overrides, run_dir, *extra), env=child_env(),
                            cwd=run_dir.parent, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def wait_for_checkpoint(process, checkpoints: Path, newer_than: int, timeout: float = 300):
    """Polls until a checkpoint past step `newer_than` exists (or the process ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        steps = [int(path.name.split("-")[1]) for path in checkpoints.glob("checkpoint-*")
                 if path.name.split("-")[1].isdigit()]
        if steps and max(steps) > newer_than:
            return max(steps)
        time.sleep(0.02)
    return None


def assert_same_result(run_dir: Path, reference_dir: Path) -> None:
    resumed = load_file(run_dir / "model" / "model.safetensors")
    reference = load_file(reference_dir / "model" / "model.safetensors")
    for name, tensor in reference.items():
        assert resumed[name].allclose(tensor, atol=1e-6), name
    scores = json.loads((run_dir / "metrics.json").read_text())["validation"]["validation"]
    expected = json.loads((reference_dir / "metrics.json").read_text())["validation"]
    assert scores == pytest.approx(expected["validation"], abs=1e-6)


@pytest.fixture
def checkpointed_run(glue_dir, vocab_dir, tmp_path):
    """A tiny MRPC run saving every few steps, and its uninterrupted result."""

    def make(max_steps: int, save_steps: int) -> tuple[list[str], Path]:
        overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
            "trainer.max_steps": max_steps, "trainer.save_strategy": "steps",
            "trainer.save_steps": save_steps, "trainer.save_total_limit": 2,
            "trainer.logging_steps": 10, "cache_dir": tmp_path / "cache"})
        reference_dir = tmp_path / "reference"
        run_to_end(overrides, reference_dir)
        return overrides, reference_dir

    return make


@pytest.mark.slow
def test_sigterm_saves_at_the_step_end_exits_143_and_resume_auto_finishes_the_run(
        checkpointed_run, tmp_path):
    overrides, reference_dir = checkpointed_run(max_steps=400, save_steps=50)
    run_dir = tmp_path / "run"
    process = subprocess.Popen(command(overrides, run_dir), env=child_env(), cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert wait_for_checkpoint(process, run_dir / "checkpoints", newer_than=0) == 50
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    assert "bertkit: preempted by SIGTERM at step " in stderr
    stopped = int(stderr.split("preempted by SIGTERM at step ")[1].split(":")[0])
    assert 50 < stopped < 400
    assert scan_checkpoints(run_dir / "checkpoints").complete.name == f"checkpoint-{stopped}"
    assert not (run_dir / "metrics.json").exists()  # not a finished run, nor a failed one
    assert not (run_dir / "failed.json").exists()

    run_to_end(overrides, run_dir, "resume=auto")
    assert_same_result(run_dir, reference_dir)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_auto_ends_as_the_uninterrupted_run(
        checkpointed_run, tmp_path):
    overrides, reference_dir = checkpointed_run(max_steps=60, save_steps=2)
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    rng = random.Random(0)
    kills, last = 0, 0
    while kills < 5:
        process = subprocess.Popen(command(overrides, run_dir, "resume=auto"), env=child_env(),
                                   cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        newest = wait_for_checkpoint(process, checkpoints, newer_than=last)
        assert newest is not None, "the run ended before it could be killed"
        # A save takes a few ms here, a step about as long: random moments land in both.
        time.sleep(rng.uniform(0, 0.05))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        kills += 1
        last = newest
    assert not (run_dir / "metrics.json").exists()
    run_to_end(overrides, run_dir, "resume=auto")
    assert_same_result(run_dir, reference_dir)


def test_under_ddp_processes_compare_flags_every_n_steps_only(monkeypatch):
    """The flag's all-reduce (a host sync on a GPU) runs at every agree_every_steps-th step;
    a signal is acted on at the next such step, by every process alike."""
    from bertkit.training.stop_and_resume import PreemptionCallback

    reductions = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "gloo")
    monkeypatch.setattr(torch.distributed, "all_reduce",
                        lambda flag, op=None: reductions.append(int(flag)))
    callback = PreemptionCallback(5, signals=[])
    stopped = []
    for step in range(1, 13):
        if step == 7:
            callback.received = signal.SIGTERM
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        callback.on_step_end(None, SimpleNamespace(global_step=step), control)
        if control.should_training_stop:
            stopped.append(step)
    assert len(reductions) == 2  # steps 5 and 10
    assert stopped == [10]


# Preemption leaves fast (the grace period may be 30 s for the whole save): what would make it
# slow, a held-out scoring after the signal, is asserted absent; the seconds are printed, not
# bounded (a loaded machine is slow too).


@pytest.mark.slow
def test_a_preempted_pretraining_run_saves_and_exits_without_scoring_after_the_signal(
        tmp_path):
    """A real pretraining run (held-out scoring on) gets SIGTERM once training has started:
    it exits 143, leaves a whole checkpoint at the step it stopped, and
    scores nothing after the signal (no held-out line, no metrics.json, no model or card)."""
    from tests.pretraining.test_pretrain_recipe import tiny_pretraining_overrides

    overrides = tiny_pretraining_overrides(**{
        "trainer.max_steps": 100000, "trainer.save_strategy": "steps", "trainer.save_steps": 5,
        "trainer.logging_steps": 5, "cache_dir": tmp_path / "cache",
        "heldout.every_steps": 3, "heldout.every_seconds": "null"})
    run_dir = tmp_path / "run"
    first = run_dir / "checkpoints" / "checkpoint-5" / "trainer_state.json"
    process = subprocess.Popen(command(overrides, run_dir),
                               env={**child_env(), "PYTHONUNBUFFERED": "1"}, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    before = []
    for line in process.stdout:  # training has started once its first checkpoint is saved
        before.append(line)
        if first.exists():
            break
    assert first.exists(), "".join(before)[-3000:]
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    after = process.stdout.read()
    process.wait(timeout=300)
    seconds = time.monotonic() - sent
    assert process.returncode == 143, after[-3000:]
    assert any("heldout/mlm_loss" in line for line in before)  # it scores while it trains
    assert "heldout/mlm_loss" not in after.split("caught SIGTERM", 1)[1], after[-3000:]
    print(f"SIGTERM to exit: {seconds:.1f} s")
    stopped = int(after.split("preempted by SIGTERM at step ")[1].split(":")[0])
    scan = scan_checkpoints(run_dir / "checkpoints")
    assert scan.complete == run_dir / "checkpoints" / f"checkpoint-{stopped}"
    assert scan.skipped == []
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "model").exists()


@pytest.mark.slow  # a run
def test_a_preempted_run_keeps_its_checkpoint_under_save_total_limit_1_with_a_best_model(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    """With load_best_model_at_end and save_total_limit=1, Trainer's end of training deletes
    every checkpoint but the best and loads the best back: after a preemption save it must
    do neither (the preemption checkpoint is the one to resume from, and the process exits)."""
    from bertkit.jobs import run_job
    from bertkit.training.trainer import BertkitTrainer
    from tests.conftest import compose_config

    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, **{
        # Too small to flip any prediction: the first evaluation (step 2) stays the best.
        "trainer.learning_rate": 1e-12, "trainer.warmup_steps": 0, "trainer.max_steps": 10,
        "trainer.eval_strategy": "steps", "trainer.eval_steps": 2,
        "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": 1, "trainer.metric_for_best_model": "validation_accuracy",
        "trainer.load_best_model_at_end": True})
    original_step, calls = BertkitTrainer.training_step, {"n": 0}

    def signalled_in_step_5(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # caught by the run: stop at this step's end
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(BertkitTrainer, "training_step", signalled_in_step_5)
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted, match="at step 5"):
        run_job(compose_config(overrides), run_dir=run_dir)
    checkpoints = run_dir / "checkpoints"
    assert scan_checkpoints(checkpoints).complete == checkpoints / "checkpoint-5"
    state = json.loads((checkpoints / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"].endswith("checkpoint-2")  # kept for the resume
    assert calls["n"] == 5


@pytest.mark.slow  # a run
def test_a_run_whose_training_raises_gives_back_the_signal_handlers(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    """on_train_end never runs when training raises; a SIGTERM handler left installed would
    outlive the run, and a worker pool forked later (datasets' num_proc) would ignore the
    SIGTERM that ends it: the pool's terminate then waits forever."""
    from bertkit.jobs import run_job
    from bertkit.training.trainer import BertkitTrainer
    from tests.conftest import compose_config

    def broken_step(self, *args, **kwargs):
        raise RuntimeError("a step that fails")

    monkeypatch.setattr(BertkitTrainer, "training_step", broken_step)
    before = {signum: signal.getsignal(signum) for signum in preemption_signals()}
    overrides = tiny_run_overrides("rte", glue_dir("rte"), vocab_dir,
                                   **{"trainer.max_steps": 2})
    with pytest.raises(RuntimeError, match="a step that fails"):
        run_job(compose_config(overrides), run_dir=tmp_path / "run")
    assert {signum: signal.getsignal(signum) for signum in preemption_signals()} == before

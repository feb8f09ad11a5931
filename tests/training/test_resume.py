"""An interrupted finetune resumes from its last checkpoint and ends where an uninterrupted
run with the same seed ends."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.training.checkpoints import scan_checkpoints
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer
from tests.conftest import compose_config, tiny_run_overrides


class Interrupted(Exception):
    pass


def interrupted_run(overrides, run_dir, monkeypatch, at_step: int) -> dict:
    """Runs until step `at_step` starts and raises there; returns the step counter, which
    the test resets to count the resumed run's steps (no more interruptions then)."""
    original_step = LengthGroupedTrainer.training_step
    calls = {"n": 0}

    def interrupt(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_step:
            raise Interrupted
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(LengthGroupedTrainer, "training_step", interrupt)
    with pytest.raises(Interrupted):
        run_job(compose_config(overrides), run_dir=run_dir)
    assert not (run_dir / "metrics.json").exists()
    return calls


def assert_same_weights(run_dir, reference_dir) -> None:
    resumed = load_file(run_dir / "model" / "model.safetensors")
    reference = load_file(reference_dir / "model" / "model.safetensors")
    for name, tensor in reference.items():
        assert resumed[name].allclose(tensor, atol=1e-5), name


def checkpointed_run(glue_dir, vocab_dir, tmp_path, save_total_limit: int):
    """8 steps of MRPC saved every 2, and the uninterrupted run's directory."""
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": save_total_limit})
    reference_dir = tmp_path / "reference"
    run_job(compose_config(overrides), run_dir=reference_dir)
    return overrides, reference_dir


def test_resume_continues_an_interrupted_run(glue_dir, vocab_dir, tmp_path, monkeypatch):
    overrides, reference_dir = checkpointed_run(glue_dir, vocab_dir, tmp_path, 2)
    run_dir = tmp_path / "run"
    calls = interrupted_run(overrides, run_dir, monkeypatch, at_step=6)
    assert (run_dir / "checkpoints" / "checkpoint-4").is_dir()

    calls["n"] = -100  # no more interruptions; count the steps the resumed run takes
    run_job(compose_config(overrides + ["resume=true"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 5..8 only
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 8
    assert_same_weights(run_dir, reference_dir)


def tear(checkpoint, how: str) -> None:
    """What a kill during a save leaves: the weights half written and no trainer_state.json
    yet, or every file but trainer_state.json cut short."""
    weights = checkpoint / "model.safetensors"
    state = checkpoint / "trainer_state.json"
    if how == "weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        state.unlink()
    else:
        state.write_text(state.read_text()[:40])


@pytest.mark.parametrize("how", ["weights", "state"])
def test_resume_auto_skips_a_checkpoint_torn_by_a_kill_during_its_save(
        how, glue_dir, vocab_dir, tmp_path, monkeypatch, caplog):
    overrides, reference_dir = checkpointed_run(glue_dir, vocab_dir, tmp_path, 3)
    run_dir = tmp_path / "run"
    calls = interrupted_run(overrides, run_dir, monkeypatch, at_step=7)
    checkpoints = run_dir / "checkpoints"
    tear(checkpoints / "checkpoint-6", how)

    calls["n"] = -100
    with caplog.at_level("WARNING"):
        run_job(compose_config(overrides + ["resume=auto"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # from checkpoint-4: steps 5..8
    assert "checkpoint-6: " in caplog.text and "trainer_state.json" in caplog.text
    assert_same_weights(run_dir, reference_dir)
    # The resumed run wrote step 6 again, whole.
    assert json.loads((checkpoints / "checkpoint-6" / "trainer_state.json").read_text())[
        "global_step"] == 6


def test_a_full_disk_during_a_save_is_one_message_and_the_previous_checkpoint_is_intact(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc", n_train=48), vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2})
    real_save, saves = torch.save, {"n": 0}

    def disk_full_at_the_second_save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            saves["n"] += 1
            if saves["n"] == 2:
                Path(f).write_bytes(b"PK\x03\x04")  # what made it to the disk
                raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_the_second_save)
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    with pytest.raises(BertkitError, match=(
            rf"no space left on device while writing {checkpoints}/checkpoint-4/optimizer.pt; "
            rf"the last complete checkpoint, {checkpoints}/checkpoint-2, is intact: free some "
            rf"space and run the same command with resume=auto")):
        run_job(compose_config(overrides), run_dir=run_dir)
    scan = scan_checkpoints(checkpoints)
    assert scan.complete == checkpoints / "checkpoint-2"
    assert [folder.name for folder, _ in scan.skipped] == ["checkpoint-4"]
    state = json.loads((checkpoints / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2

"""An interrupted finetune resumes from its last checkpoint and ends where an uninterrupted
run with the same seed ends."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from bertkit.jobs import run_job
from bertkit.training.length_grouped_trainer import LengthGroupedTrainer
from tests.conftest import compose_config, tiny_run_overrides


class Interrupted(Exception):
    pass


def test_resume_continues_an_interrupted_run(glue_dir, vocab_dir, tmp_path, monkeypatch):
    data = glue_dir("mrpc", n_train=48)
    overrides = tiny_run_overrides("mrpc", data, vocab_dir, **{
        "trainer.max_steps": 8, "trainer.save_strategy": "steps", "trainer.save_steps": 2,
        "trainer.save_total_limit": 2})

    reference_dir = tmp_path / "reference"
    run_job(compose_config(overrides), run_dir=reference_dir)

    original_step = LengthGroupedTrainer.training_step
    calls = {"n": 0}

    def interrupt_after_five_steps(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise Interrupted
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(LengthGroupedTrainer, "training_step", interrupt_after_five_steps)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        run_job(compose_config(overrides), run_dir=run_dir)
    assert not (run_dir / "metrics.json").exists()
    assert (run_dir / "checkpoints" / "checkpoint-4").is_dir()

    calls["n"] = -100  # no more interruptions; count the steps the resumed run takes
    run_job(compose_config(overrides + ["resume=true"]), run_dir=run_dir)
    assert calls["n"] == -100 + 4  # steps 5..8 only
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 8

    resumed = load_file(run_dir / "model" / "model.safetensors")
    reference = load_file(reference_dir / "model" / "model.safetensors")
    for name, tensor in reference.items():
        assert resumed[name].allclose(tensor, atol=1e-5), name

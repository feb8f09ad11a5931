"""The final losses are the last step's window: a run shorter than trainer.logging_steps used to
end on step 1's line, which the printout, metrics.json and W&B's final/* then showed. The
losses are recorded here step by step from the model's own outputs, independently of
Trainer's logging."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from transformers import Trainer

from bertkit.jobs import run_job
from bertkit.pretraining.trainer import PretrainingTrainer
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import small_run
from tests.wandb_records import read_offline_run


def _record_pretraining_steps(monkeypatch) -> list[dict]:
    """Each training forward's MLM sums and loss (gradient accumulation 1: one per step)."""
    steps = []
    compute_loss = PretrainingTrainer.compute_loss

    def recording(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = compute_loss(self, model, inputs, True, num_items_in_batch)
        if model.training:
            steps.append({"loss": loss.item(), "mlm_loss_sum": outputs["mlm_loss_sum"].item(),
                          "mlm_count": outputs["mlm_count"].item()})
        return (loss, outputs) if return_outputs else loss

    monkeypatch.setattr(PretrainingTrainer, "compute_loss", recording)
    return steps


def test_pretraining_prints_and_records_the_last_steps_losses(tmp_path, monkeypatch, capsys):
    steps = _record_pretraining_steps(monkeypatch)
    run_dir = tmp_path / "run"
    record = run_job(compose_config(small_run(**{
        "trainer.max_steps": 3, "trainer.logging_steps": 100, "logger": "wandb"})), run_dir)
    assert len(steps) == 3
    window = steps[1:]  # step 1 has its own line (logging_first_step); steps 2-3 the last
    mlm_loss = sum(s["mlm_loss_sum"] for s in window) / sum(s["mlm_count"] for s in window)
    last = record["last_log"]
    assert last["step"] == 3
    assert last["mlm_loss"] == pytest.approx(mlm_loss, rel=1e-5)
    assert last["loss"] == pytest.approx(np.mean([s["loss"] for s in window]), rel=1e-5)
    printed = capsys.readouterr().out
    line = re.search(r"pretraining on demo: MLM loss ([0-9.]+), .* \(mean over steps 2-3\), "
                     r"after 3 steps", printed)
    assert line is not None, printed
    assert float(line.group(1)) == pytest.approx(mlm_loss, abs=1e-4)
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    summary = read_offline_run(offline)["summary"]
    assert summary["final/mlm_loss"] == pytest.approx(mlm_loss, rel=1e-5)
    assert summary["final/step"] == 3


@pytest.mark.slow  # a pretraining run
def test_a_run_logged_every_step_says_its_last_step(tmp_path, capsys):
    run_job(compose_config(small_run(**{"trainer.max_steps": 2})), tmp_path / "run")
    assert "(step 2), after 2 steps" in capsys.readouterr().out


@pytest.mark.slow  # a run
def test_finetuning_last_training_loss_is_the_last_steps(glue_dir, vocab_dir, tmp_path,
                                                         monkeypatch):
    losses = []
    training_step = Trainer.training_step

    def recording(self, model, inputs, num_items_in_batch=None):
        loss = training_step(self, model, inputs, num_items_in_batch)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(Trainer, "training_step", recording)
    run_dir = tmp_path / "run"
    run_job(compose_config(tiny_run_overrides(
        "rte", glue_dir("rte"), vocab_dir, logger="wandb",
        **{"trainer.max_steps": 3, "trainer.logging_steps": 50})), run_dir)
    assert len(losses) == 3
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    summary = read_offline_run(offline)["summary"]
    assert summary["train/loss"] == pytest.approx(float(torch.tensor(losses[1:]).mean()),
                                                  rel=1e-5)
    assert summary["train/global_step"] == 3
    # metrics.json's train.loss is Trainer's train_loss, the mean over every step: the model's
    # card names it so, not as the final loss.
    mean = json.loads((run_dir / "metrics.json").read_text())["train"]["loss"]
    assert mean == pytest.approx(float(np.mean(losses)), rel=1e-5)
    card = (run_dir / "model" / "README.md").read_text()
    assert f"- mean training loss (every step): {round(mean, 4)}\n" in card

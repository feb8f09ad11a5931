"""A real W&B run in offline mode: its stored config and summary are read back from the
run's own transaction log, not from a mock."""

from __future__ import annotations

import json

import pytest

from bertkit.jobs import run_job
from bertkit.training.wandb_logging import resolve_wandb_mode
from tests.conftest import compose_config, tiny_run_overrides
from tests.wandb_records import read_offline_run


@pytest.mark.slow  # a run
def test_offline_run_logs_paper_hyperparameters(glue_dir, vocab_dir, tmp_path, capsys, caplog):
    data = glue_dir("rte")
    overrides = tiny_run_overrides("rte", data, vocab_dir, logger="wandb", seed=7,
                                   **{"trainer.learning_rate": 3e-5,
                                      "trainer.eval_strategy": "steps",
                                      "trainer.eval_steps": 2})
    cfg = compose_config(overrides)
    run_dir = tmp_path / "run"
    run_job(cfg, run_dir=run_dir)

    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    config = logged["config"]
    expected = {
        "learning_rate": 3e-5, "warmup_ratio": 0.1, "weight_decay": 0.01, "adam_beta1": 0.9,
        "adam_beta2": 0.999, "adam_epsilon": 1e-6, "max_grad_norm": 1.0,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
        "train_batch_size": 8, "num_train_epochs": 3, "max_seq_length": 128, "seed": 7,
        "lr_scheduler_type": "linear",
    }
    for key, value in expected.items():
        assert config[key] == pytest.approx(value) if isinstance(value, float) \
            else config[key] == value, key
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert config["num_parameters"] == metrics["hyperparameters"]["num_parameters"] > 0
    # The whole resolved config rides along under "bertkit".
    assert config["bertkit"]["task"]["name"] == "rte"
    assert config["bertkit"]["trainer"]["learning_rate"] == pytest.approx(3e-5)
    assert logged["group"] == "glue-rte"
    assert {"recipe:glue", "task:rte", "seed:7"} <= set(logged["tags"])
    # Training curves and final metrics.
    assert "train/loss" in logged["summary"] and "eval/validation_accuracy" in logged["summary"]
    assert logged["summary"]["final/validation/accuracy"] == pytest.approx(
        metrics["validation"]["validation"]["accuracy"])
    # Offline without credentials is said once.
    notices = [r for r in caplog.records if "no credentials" in r.getMessage()]
    assert len(notices) == 1


def test_mode_resolution(monkeypatch, tmp_path):
    assert resolve_wandb_mode("auto") == "offline"  # conftest removes every credential
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("online") == "disabled"


def test_logger_none_writes_no_wandb_files(glue_task_run):
    run_dir, _, _ = glue_task_run("wnli")  # tests.runs: tiny_run_overrides, logger=none
    assert not (run_dir / "wandb").exists()
    assert (run_dir / "metrics.json").is_file()

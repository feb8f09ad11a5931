"""FSDP and DeepSpeed: refused by name in a process started alone (with the torchrun command
that works), the shipped DeepSpeed config accepted by Trainer and following the trainer
group, and a 2-process finetune under each on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification

from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.training import run as arguments
from tests.conftest import compose_config, tiny_run_overrides
from tests.test_cli import assert_clean_failure, run_cli

ZERO2 = Path(config_dir()) / "deepspeed" / "zero2.json"
SHARDING = {"fsdp": "+trainer.fsdp=true", "deepspeed": f"+trainer.deepspeed={ZERO2}"}


@pytest.mark.parametrize("key", SHARDING)
def test_sharding_in_a_process_started_alone_is_refused_with_the_launch_command(
        key, monkeypatch, tmp_path):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cfg = compose_config(["recipe=glue", "task=rte", SHARDING[key]])
    with pytest.raises(BertkitError, match=rf"^trainer\.{key}=.*torchrun --nproc_per_node=N "
                                           r"-m bertkit <the same overrides>"):
        arguments.build_training_arguments(cfg, tmp_path, [])


def test_under_a_launcher_fsdp_is_passed_to_trainer_and_deepspeed_asks_for_its_extra(
        monkeypatch, tmp_path):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(arguments, "deepspeed_installed", lambda: False)
    with pytest.raises(BertkitError, match=r"DeepSpeed is not installed.*bertkit\[deepspeed\]"):
        arguments.check_sharding_launch({"deepspeed": ZERO2})
    arguments.check_sharding_launch({"fsdp": True})  # launched: Trainer's to run
    monkeypatch.delenv("LOCAL_RANK")
    arguments.check_sharding_launch({"fsdp": False, "deepspeed": None})  # off: nothing asked


@pytest.mark.slow
def test_fsdp_from_the_command_line_in_one_process_is_one_line(tmp_path):
    result = run_cli("+trainer.fsdp=true", "logger=none", cwd=tmp_path)
    assert_clean_failure(result, "trainer.fsdp=True", "torchrun --nproc_per_node=N -m bertkit")
    assert result.returncode == 2


def test_the_deepspeed_config_leaves_batch_precision_clipping_and_optimizer_to_bertkit():
    config = json.loads(ZERO2.read_text())
    assert config["zero_optimization"]["stage"] == 2
    # No optimizer or scheduler: Trainer builds bertkit's, which DeepSpeed then runs.
    assert "optimizer" not in config and "scheduler" not in config
    # What Trainer fills from TrainingArguments (transformers' HfTrainerDeepSpeedConfig).
    assert {key for key, value in config.items() if value == "auto"} == {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping"}
    assert config["fp16"] == config["bf16"] == {"enabled": "auto"}


def test_the_scale_guide_names_the_shipped_deepspeed_config():
    guide = Path(__file__).resolve().parents[2] / "docs" / "scale.md"
    assert "+trainer.deepspeed=conf/deepspeed/zero2.json" in guide.read_text()


def test_training_arguments_accept_the_deepspeed_config_and_fill_it(tmp_path):
    pytest.importorskip("deepspeed")
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), deepspeed=str(ZERO2), report_to=[],
                             per_device_train_batch_size=8, gradient_accumulation_steps=2,
                             max_grad_norm=0.5)
    filled = args.hf_deepspeed_config.config
    assert filled["train_micro_batch_size_per_gpu"] == 8
    assert filled["gradient_accumulation_steps"] == 2
    assert filled["train_batch_size"] == 16
    assert filled["gradient_clipping"] == 0.5
    assert filled["fp16"]["enabled"] is False and filled["bf16"]["enabled"] is False


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("key", SHARDING)
def test_a_sharded_two_process_finetune_trains_and_saves_one_model(
        key, glue_dir, vocab_dir, tmp_path):
    if key == "deepspeed":
        pytest.importorskip("deepspeed")
    data = glue_dir("rte", n_train=40, n_dev=12, n_test=6)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    overrides = tiny_run_overrides("rte", data, vocab_dir, **{"trainer.max_steps": 3})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "bertkit", *overrides, SHARDING[key],
               f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(list(tmp_path.rglob("metrics.json"))) == 1
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 3 and metrics["train"]["complete"]
    assert metrics["hyperparameters"]["train_batch_size"] == 16  # 8 per process x 2
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "model")
    assert model.config.hidden_size == 32

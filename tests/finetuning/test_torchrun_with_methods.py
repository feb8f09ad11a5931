"""The finetuning methods under torchrun (2 CPU processes, gloo): layer-wise rates, the layer
mix, R3F and frozen embeddings train data-parallel; LoRA too; gradual unfreezing is refused
with the reason, not run with layers that DistributedDataParallel would never synchronise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def torchrun(data, vocab, run_dir, *settings: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "bertkit", "recipe=glue", "task=mrpc",
               f"task.data_dir={data}", "model=scratch_tiny", f"model.tokenizer={vocab}",
               "model.config.hidden_size=32", "model.config.intermediate_size=64",
               "logger=none", "trainer.max_steps=3", "trainer.per_device_train_batch_size=4",
               "trainer.disable_tqdm=true", "trainer.learning_rate=1e-3",
               f"hydra.run.dir={run_dir}", *settings]
    return subprocess.run(command, cwd=run_dir.parent, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("settings", [
    ("finetuning=llrd", "finetuning.layer_mix=true", "finetuning.r3f.weight=1.0",
     "finetuning.freeze_embeddings=true"),
    ("finetuning=lora",),
], ids=["llrd+mix+r3f+freeze", "lora"])
def test_methods_train_data_parallel(settings, glue_dir, vocab_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(glue_dir("mrpc", n_train=40), vocab_dir, run_dir, *settings)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 3
    assert metrics["hyperparameters"]["train_batch_size"] == 8
    assert metrics["hyperparameters"]["finetuning"]["name"] in ("llrd", "lora")


@pytest.mark.slow
@pytest.mark.distributed
def test_gradual_unfreezing_is_refused_under_torchrun(glue_dir, vocab_dir, tmp_path):
    result = torchrun(glue_dir("mrpc"), vocab_dir, tmp_path / "run",
                      "finetuning=gradual_unfreezing")
    assert result.returncode != 0
    assert "finetuning.unfreeze_every does not run under torchrun" in result.stdout + \
        result.stderr

"""A tiny finetune launched with torchrun on 2 CPU processes (gloo): one set of results, and
predictions gathered back in dataset order."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_finetune_writes_one_set_of_results(glue_dir, vocab_dir, tmp_path):
    data = glue_dir("stsb", n_train=40, n_dev=13, n_test=7)  # odd sizes: uneven shards
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "bertkit", "recipe=glue", "task=stsb",
               f"task.data_dir={data}", "model=scratch_tiny", f"model.tokenizer={vocab_dir}",
               "model.config.hidden_size=32", "model.config.intermediate_size=64",
               "logger=none", "trainer.max_steps=3", "trainer.per_device_train_batch_size=4",
               "trainer.per_device_eval_batch_size=3", "trainer.disable_tqdm=true",
               "trainer.learning_rate=1e-3", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert len(list(tmp_path.rglob("metrics.json"))) == 1
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 3
    assert metrics["hyperparameters"]["train_batch_size"] == 8  # 4 per process x 2
    # The throughput counts the batches of both processes: 3 steps x 4 examples x 2.
    throughput = metrics["train"]["throughput"]
    assert throughput["processes"] == 2 and throughput["samples"] == 24

    with open(run_dir / "predictions" / "validation.tsv", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))[1:]
    assert [int(r[0]) for r in rows] == list(range(13))
    with open(run_dir / "leaderboard" / "STS-B.tsv", newline="") as handle:
        assert len(list(csv.reader(handle, delimiter="\t"))) == 1 + 7

    # The gathered predictions are the saved model's, example by example, in file order.
    with open(data / "dev.tsv", newline="") as handle:
        dev = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").eval()
    with torch.no_grad():
        batch = tokenizer([r[7] for r in dev], [r[8] for r in dev], padding=True,
                          truncation=True, max_length=128, return_tensors="pt")
        expected = model(**batch).logits.squeeze(-1).numpy()
    written = np.array([float(r[2]) for r in rows])
    np.testing.assert_allclose(written, expected, rtol=1e-4, atol=1e-5)

"""What W&B gets from a run with finetuning methods on: the settings in its config under plain
names, each group's learning rate and the R3F term as curves, and the learned layer-mix
weights."""

from __future__ import annotations

import pytest

from bertkit.jobs import run_job
from tests.conftest import compose_config, tiny_run_overrides
from tests.wandb_records import read_offline_run


@pytest.mark.slow  # a run
def test_settings_rates_and_mix_weights_reach_w_and_b(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("rte", glue_dir("rte"), vocab_dir, logger="wandb",
                                            finetuning="llrd",
                                            **{"finetuning.layer_mix": True,
                                               "finetuning.r3f.weight": 1.0}))
    record = run_job(cfg, tmp_path / "run")
    (offline,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    assert logged["config"]["finetuning"]["name"] == "llrd"
    assert logged["config"]["finetuning"]["layer_lr_decay"] == pytest.approx(0.95)
    assert {"train/lr/embeddings", "train/lr/layer_0", "train/lr/layer_1",
            "train/lr/head", "train/r3f"} <= logged["history_keys"]
    weights = record["details"]["finetuning"]["layer_mix"]["weights"]
    for i, weight in enumerate(weights):
        assert logged["summary"][f"final/finetuning/layer_mix/weights/{i}"] == \
            pytest.approx(weight)

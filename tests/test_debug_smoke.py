"""debug=smoke (conf/debug/smoke.yaml): every recipe and preset composes with it, keeping its
model and task, with a couple of steps, cut splits, no W&B run and a directory of its own;
a finetune of every task family (bertkit.tasks.FAMILIES) and a pretraining run complete with
it, leaving metrics.json, the model and its card, and no checkpoint."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.config_paths import recipes_dir
from bertkit.config_schema import check_ranges
from bertkit.jobs import run_job
from bertkit.jobs.two_stage import stage_configs
from bertkit.pretraining.run import downstream_configs, pretrain
from bertkit.tasks import FAMILIES
from tests.conftest import compose_config
from tests.family_fixtures import tiny_family_run

RECIPES = sorted(path.stem for path in (Path(recipes_dir()) / "recipe").glob("*.yaml"))
PRESETS = sorted(path.stem for path in (Path(recipes_dir()) / "experiment").glob("*.yaml"))
SIZES = (24, 20, 18)  # above the preset's cuts (16)


@functools.cache
def smoke_steps() -> int:
    """The preset's trainer.max_steps, on the default recipe."""
    return compose_config(["debug=smoke"]).trainer.max_steps


def _limits(cfg) -> dict:
    return {key: OmegaConf.select(cfg, f"task.{key}")
            for key in ("max_train_samples", "max_eval_samples", "max_predict_samples")}


@pytest.mark.parametrize("selection", [f"recipe={name}" for name in RECIPES]
                         + [f"experiment={name}" for name in PRESETS])
def test_every_recipe_and_preset_composes_smoke_keeping_its_model_and_task(selection):
    plain = compose_config([selection])
    smoke = compose_config([selection, "debug=smoke"], with_hydra=True)
    check_ranges(smoke)
    assert smoke.model == plain.model
    assert OmegaConf.select(smoke, "task.name") == OmegaConf.select(plain, "task.name")
    assert smoke.recipe == plain.recipe
    assert smoke.logger.backend == "none"
    assert smoke.hydra.run.dir.startswith("outputs/smoke/")
    assert smoke.hydra.sweep.dir.startswith("multirun/smoke/")
    assert smoke.keep_checkpoints is False
    if plain.recipe.job == "finetune":
        # over the recipe's and the preset's (a protocol's epochs, a calibrated batch)
        assert smoke.trainer.max_steps == smoke_steps() <= 2
        assert smoke.trainer.per_device_train_batch_size == 8
        assert set(_limits(smoke).values()) == {16}
        assert set(_limits(plain).values()) == {None}
    if plain.recipe.job == "pretrain":
        assert smoke.trainer.max_steps == smoke_steps()
        assert smoke.corpus.name == plain.corpus.name
        assert smoke.corpus.max_documents == 16 and smoke.heldout.max_sequences == 16


def test_keys_on_the_command_line_win_over_the_preset():
    cfg = compose_config(["recipe=glue", "debug=smoke", "trainer.max_steps=5", "logger=wandb",
                          "task.max_train_samples=64"])
    assert cfg.trainer.max_steps == 5 and cfg.logger.backend == "wandb"
    assert cfg.task.max_train_samples == 64 and cfg.task.max_eval_samples == 16


def test_the_configs_a_job_composes_for_itself_are_smoke_runs_when_it_is(tmp_path):
    """Pretraining's downstream finetunes and two-stage finetuning's first task."""
    for smoke in (True, False):
        debug = ["debug=smoke"] if smoke else []
        pretraining = compose_config(["experiment=pretrain_small",
                                      "downstream.tasks={rte: []}", *debug])
        first, _ = stage_configs(compose_config(
            ["recipe=glue", "task=mrpc", "finetuning=stilts", "finetuning.intermediate.task=rte",
             *debug]), tmp_path)
        downstream = downstream_configs(pretraining, tmp_path / "model")
        for cfg in (downstream["rte"], first):
            assert cfg.task.name == "rte"
            assert cfg.trainer.max_steps == (smoke_steps() if smoke else -1)
            assert set(_limits(cfg).values()) == ({16} if smoke else {None})


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_smoke_finetune_of_every_family_leaves_metrics_the_model_and_its_card(
        family, tmp_path):
    overrides, sizes = tiny_family_run(family, tmp_path, SIZES)
    run_dir = tmp_path / "run"
    record = run_job(compose_config([*overrides, "debug=smoke"]), run_dir)
    assert record["train"]["steps"] == 2
    assert record["details"]["limited_samples"] == {
        split: {"examples": 16, "of": size} for split, size in sizes.items()}
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["main_value"] == record["main_value"]
    assert written["details"]["limited_samples"] == record["details"]["limited_samples"]
    assert (run_dir / "model" / "config.json").is_file()
    assert "bertkit" in (run_dir / "model" / "README.md").read_text()
    assert not list(run_dir.rglob("checkpoint-*"))  # a smoke run keeps none


@pytest.mark.slow
def test_a_smoke_pretraining_run_scores_held_out_and_its_downstream_finetune_is_smoke_too(
        tmp_path, glue_dir):
    sst2 = glue_dir("sst2", n_train=24, n_dev=20, n_test=18)
    run_dir = tmp_path / "pretrain"
    cfg = compose_config([
        "recipe=pretrain", "corpus=demo", "model=scratch_tiny",
        "model.config.max_position_embeddings=128", "tokenizer_training.enabled=true",
        "tokenizer_training.vocab_size=400", "pretraining.max_seq_length=64",
        "pretraining.long_phase.fraction=0",
        f"cache_dir={tmp_path / 'cache'}", "trainer.disable_tqdm=true",
        f"downstream.tasks={{sst2: ['task.data_dir={sst2}']}}", "debug=smoke"])
    summary = pretrain(cfg, run_dir)
    assert summary["train"]["steps"] == 2
    written = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < written["heldout"]["sequences"] <= 16  # heldout.max_sequences
    assert [point["step"] for point in written["heldout"]["curve"]] == [0, 2]
    assert (run_dir / "model" / "README.md").is_file()
    finetuned = json.loads((run_dir / "downstream" / "sst2" / "metrics.json").read_text())
    assert finetuned["train"]["steps"] == 2
    assert finetuned["details"]["limited_samples"]["train"] == {"examples": 16, "of": 24}
    assert not list(run_dir.rglob("checkpoint-*"))  # nor its downstream finetune


@pytest.mark.slow
def test_the_command_writes_a_smoke_run_under_outputs_smoke(tmp_path):
    """`bertkit recipe=demo debug=smoke`, as a user types it."""
    env = {**os.environ, "BERTKIT_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "bertkit", "recipe=demo", "debug=smoke",
                           "trainer.disable_tqdm=true"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = list((tmp_path / "outputs" / "smoke" / "demo" / "demo").iterdir())
    assert len(runs) == 1
    record = json.loads((runs[0] / "metrics.json").read_text())
    assert record["train"]["steps"] == 2
    assert record["details"]["limited_samples"]["train"] == {"examples": 16, "of": 2000}
    assert (runs[0] / "model" / "README.md").is_file()

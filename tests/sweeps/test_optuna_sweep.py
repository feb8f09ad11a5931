"""sweep=optuna end to end: a real Optuna study (TPE, hydra-optuna-sweeper) of a few trials of a
tiny model on generated STS-B data (Spearman: continuous scores, so trials rarely tie), its
optimization_results.yaml checked against the trials' own files, bertkit-report over it, and a
study that outlives a failed trial."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
from omegaconf import OmegaConf
from optuna.distributions import (
    CategoricalDistribution,
    LogUniformDistribution,
    UniformDistribution,
)

from bertkit import cli
from bertkit.reporting.cli import main as report_main
from tests.conftest import compose_config
from tests.sweeps.test_successive_halving import run_bertkit_in_process, tiny_sweep_overrides

# The test's learning-rate interval, wider and higher than the preset's 1e-5..1e-4 so that a
# tiny model's few steps give the trials different scores.
LR_LOW, LR_HIGH = 1e-4, 1e-2
SEARCHED = {  # Optuna's parameter name -> where a trial's metrics.json records it
    "trainer.learning_rate": ("learning_rate",),
    "trainer.per_device_train_batch_size": ("per_device_train_batch_size",),
    "trainer.warmup_steps": ("warmup_steps",),
    "finetuning.layer_lr_decay": ("finetuning", "layer_lr_decay"),
}


def optuna_overrides(data: Path, vocab: Path, sweep_dir: Path, n_trials: int) -> list[str]:
    """tiny_sweep_overrides without its grid (the space is the preset's), on STS-B, narrowed on
    the command line as a user would: one epoch (a plain override fixes a searched parameter),
    batch 8 or 16, and the test's learning-rate interval (a sweep override replaces a range)."""
    base = [o for o in tiny_sweep_overrides(data, vocab, sweep_dir)
            if "," not in o and not o.startswith(("task=", "trainer.num_train_epochs="))]
    return ["-m", "sweep=optuna", *base, "task=stsb", "seed=1", "trainer.num_train_epochs=1",
            "trainer.per_device_train_batch_size=choice(8,16)",
            f"trainer.learning_rate=tag(log, interval({LR_LOW}, {LR_HIGH}))",
            f"hydra.sweeper.n_trials={n_trials}", "hydra.sweeper.n_jobs=1"]


def trial_files(sweep_dir: Path, name: str) -> dict[str, dict]:
    """trial directory name -> its metrics.json (or failed.json)."""
    return {p.parent.name: json.loads(p.read_text())
            for p in sorted((sweep_dir / "stsb").glob(f"trial*/{name}"))}


def searched_values(metrics: dict) -> dict[str, float]:
    values = {}
    for param, path in SEARCHED.items():
        value = metrics["hyperparameters"]
        for key in path:
            value = value[key]
        values[param] = value
    return values


def check_results_name_the_best(sweep_dir: Path, finished: dict[str, dict]) -> str:
    """optimization_results.yaml: best_value is the highest main_value of the finished trials
    and best_params that trial's sampled values (Optuna keeps the first of equal bests).
    Returns the best trial's directory name."""
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best_value = max(m["main_value"] for m in finished.values())
    best = min((name for name, m in finished.items() if m["main_value"] == best_value),
               key=lambda name: int(name.removeprefix("trial")))
    assert results["name"] == "optuna"
    assert results["best_value"] == best_value
    assert results["best_params"] == searched_values(finished[best])
    config = yaml.safe_load((sweep_dir / "stsb" / best / "config.yaml").read_text())
    assert config["trainer"]["learning_rate"] == results["best_params"]["trainer.learning_rate"]
    assert config["finetuning"]["layer_lr_decay"] == (
        results["best_params"]["finetuning.layer_lr_decay"])
    return best


def test_preset_search_space_and_settings():
    """The space as the sweeper parses it: log-uniform rate, the paper's batches and epochs,
    warmup share and layer decay uniform; TPE seeded, maximising, going on after failures."""
    cfg = compose_config(["recipe=glue", "task=rte", "sweep=optuna", "seed=1"], with_hydra=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.sampler.seed is not None
    assert (sweeper.direction, sweeper.n_jobs, sweeper.max_failure_rate) == ("maximize", 1, 1.0)
    assert sweeper.study_name == "bertkit-glue-rte"
    space, fixed = create_params_from_overrides([f"{k}={v}" for k, v in sweeper.params.items()])
    assert fixed == {}
    assert space == {
        "trainer.learning_rate": LogUniformDistribution(1e-5, 1e-4),
        "trainer.per_device_train_batch_size": CategoricalDistribution([16, 32]),
        "trainer.num_train_epochs": CategoricalDistribution([2, 3, 4]),
        "trainer.warmup_steps": UniformDistribution(0.0, 0.2),
        "finetuning.layer_lr_decay": UniformDistribution(0.8, 1.0),
    }
    sweep = OmegaConf.to_container(cfg.hydra.sweep)  # not resolved: job.num is set per trial
    assert sweep["subdir"] == "${recipe.dataset}/trial${hydra.job.num}"
    assert cfg.logger.sweep_tag == "optuna"


@pytest.mark.slow
def test_optuna_study_and_its_report(glue_dir, vocab_dir, tmp_path, monkeypatch):
    data = glue_dir("stsb", n_train=64, n_dev=32)
    sweep_dir = tmp_path / "sweep"
    run_bertkit_in_process(monkeypatch, *optuna_overrides(data, vocab_dir, sweep_dir, 4),
                           f"cache_dir={tmp_path / 'cache'}")

    # One directory per trial, numbered on across the study's batches of n_jobs=1.
    assert sorted(p.name for p in (sweep_dir / "stsb").iterdir()) == [
        f"trial{i}" for i in range(4)]
    finished = trial_files(sweep_dir, "metrics.json")
    assert sorted(finished) == [f"trial{i}" for i in range(4)]
    for metrics in finished.values():
        assert math.isfinite(metrics["main_value"])
        assert metrics["main_metric"] == "spearman"
        hyper = metrics["hyperparameters"]
        assert LR_LOW <= hyper["learning_rate"] <= LR_HIGH
        assert hyper["per_device_train_batch_size"] in (8, 16)
        assert hyper["num_train_epochs"] == 1  # the command line's fixed value, not searched
        assert 0.0 <= hyper["warmup_steps"] <= 0.2
        assert 0.8 <= hyper["finetuning"]["layer_lr_decay"] <= 1.0
    rates = [m["hyperparameters"]["learning_rate"] for m in finished.values()]
    assert len(set(rates)) == len(rates)
    # The preset's W&B sweep id reaches the trials, each its own group, named by what it
    # sampled (logger=none still resolves them).
    loggers = [yaml.safe_load((sweep_dir / "stsb" / trial / "config.yaml").read_text())["logger"]
               for trial in sorted(finished)]
    assert {logger["sweep_id"] for logger in loggers} == {f"optuna-{sweep_dir.name}"}
    assert len({logger["group"] for logger in loggers}) == len({logger["name"] for logger in
                                                                loggers}) == 4
    for logger, metrics in zip(loggers, finished.values(), strict=True):
        assert logger["group"].startswith(f"optuna-{sweep_dir.name} ")
        assert f"learning_rate:{metrics['hyperparameters']['learning_rate']}" in logger["name"]

    assert len({m["main_value"] for m in finished.values()}) > 1  # a best to find
    best = check_results_name_the_best(sweep_dir, finished)

    # bertkit-report: each trial samples its own warm-up and finetuning.layer_lr_decay, so
    # each is its own system, one run each (bertkit.reporting.identity); the best trial's row
    # holds the best score.
    assert report_main([str(sweep_dir)]) == 0
    report = json.loads((sweep_dir / "report" / "report.json").read_text())
    assert report["rows_split_by"]["keys"] == ["finetuning.layer_lr_decay",
                                               "trainer.warmup_steps"]
    systems = {system["system"]: system for system in report["systems"]}
    assert len(systems) == 4
    by_dir = {system["tasks"]["stsb"]["run_dirs"][0]: system for system in systems.values()}
    for name, record in finished.items():
        system = by_dir[f"stsb/{name}"]
        decay = record["hyperparameters"]["finetuning"]["layer_lr_decay"]
        assert system["settings"]["finetuning.layer_lr_decay"] == f"{decay:g}"
        assert f"layer_lr_decay={decay:g}" in system["system"]
        assert system["tasks"]["stsb"]["runs_tried"] == 1
    assert max(systems.values(), key=lambda s: s["tasks"]["stsb"]["summary"]["mean"])[
        "tasks"]["stsb"]["run_dirs"] == [f"stsb/{best}"]


@pytest.mark.slow
def test_optuna_study_goes_on_after_a_failed_trial(glue_dir, vocab_dir, tmp_path, monkeypatch):
    """Trial 1 runs out of memory: failed.json in its directory, Optuna is told FAIL (None is
    no value), the study runs its remaining trials and names the best of the finished ones."""
    data = glue_dir("stsb", n_train=64, n_dev=32)
    sweep_dir = tmp_path / "sweep"
    real_run_job = cli.run_job

    def run_or_run_out_of_memory(cfg):
        if HydraConfig.get().job.num == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_run_job(cfg)

    monkeypatch.setattr(cli, "run_job", run_or_run_out_of_memory)
    with pytest.raises(SystemExit) as stopped:  # once the study ended, naming the failed trial
        run_bertkit_in_process(monkeypatch, *optuna_overrides(data, vocab_dir, sweep_dir, 3),
                               f"cache_dir={tmp_path / 'cache'}")
    assert stopped.value.code == 1

    failed = trial_files(sweep_dir, "failed.json")
    assert list(failed) == ["trial1"]
    assert failed["trial1"]["error"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert failed["trial1"]["job"] == 1
    assert any(o.startswith("trainer.learning_rate=") for o in failed["trial1"]["overrides"])
    finished = trial_files(sweep_dir, "metrics.json")
    assert sorted(finished) == ["trial0", "trial2"]  # the study went on after the failure
    check_results_name_the_best(sweep_dir, finished)

"""A multirun's W&B runs, read back from their offline logs: one sweep tag per launch, a group
per configuration (its seeds together, nothing else), a name per job; the workspace built from
one launch selects its runs and no other launch's. Each run's summary carries what
bertkit-report ranks by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.reporting.wandb_workspace import build_workspace, plan_workspace, read_sweep
from bertkit.reporting.wandb_workspace import workspace_view as view_of
from tests.conftest import tiny_run_overrides
from tests.sweeps.test_successive_halving import run_bertkit_in_process
from tests.wandb_records import read_offline_run

RATES = ("0.001", "0.0003")  # as Hydra writes 1e-3 and 3e-4 into a job's overrides


def launch(monkeypatch, sweep_dir: Path, data: Path, vocab: Path, *preset: str) -> list[dict]:
    """Two learning rates x two seeds, W&B offline; each job's logged run, with its config.yaml
    beside it."""
    overrides = [o for o in tiny_run_overrides("wnli", data, vocab, logger="wandb",
                                               **{"logger.mode": "offline",
                                                  "trainer.max_steps": 2})
                 if not o.startswith("trainer.learning_rate=")]
    run_bertkit_in_process(monkeypatch, "-m", *preset, *overrides,
                           "trainer.learning_rate=1e-3,3e-4", "seed=1,2",
                           f"hydra.sweep.dir={sweep_dir}", wandb_mode="offline")
    runs = sorted(sweep_dir.rglob("offline-run-*"))
    assert len(runs) == 4
    logged = []
    for run in runs:
        entry = read_offline_run(run)
        entry["run_dir"] = run.parents[1]
        logged.append(entry)
    return logged


def sweep_tags(entry: dict) -> list[str]:
    return [tag for tag in entry["tags"] if tag.startswith("sweep:")]


def passes(filters: list[dict], entry: dict) -> bool:
    """Whether a logged run passes a workspace's run filters (W&B ANDs them; IN is all they
    use): the run's group, or one of its tags, among the values."""
    for condition in filters:
        assert condition["op"] == "IN", condition
        name = condition["key"]["name"]
        values = {entry["group"]} if name == "group" else set(entry[name])
        if not values & set(condition["value"]):
            return False
    return True


@pytest.mark.slow  # two launches of four jobs, each a W&B run
def test_each_multirun_is_a_sweep_of_its_own_grouped_by_configuration(
        glue_dir, vocab_dir, tmp_path, monkeypatch):
    data = glue_dir("wnli", n_train=16)
    first = launch(monkeypatch, tmp_path / "first", data, vocab_dir)
    # The preset's grid narrowed on the command line to the same two rates (its batch sizes
    # and epochs to one each): only what the launch sweeps names a run.
    second = launch(monkeypatch, tmp_path / "second", data, vocab_dir, "sweep=paper_grid",
                    "trainer.per_device_train_batch_size=8", "trainer.num_train_epochs=1")

    for logged, tag in ((first, "sweep:multirun-first"), (second, "sweep:paper_grid-second")):
        # One tag for the whole launch, its own.
        assert [sweep_tags(entry) for entry in logged] == [[tag]] * 4
        # Four distinct names, each the job's swept settings.
        assert sorted(entry["name"] for entry in logged) == sorted(
            f"wnli learning_rate:{rate} seed:{seed}" for rate in RATES for seed in (1, 2))
        # The seeds of one learning rate share a group, the two rates do not.
        groups = {}
        for entry in logged:
            groups.setdefault(entry["group"], set()).add(
                (entry["config"]["learning_rate"], entry["config"]["seed"]))
        assert groups == {f"{tag.removeprefix('sweep:')} learning_rate:{rate}":
                          {(float(rate), 1), (float(rate), 2)} for rate in RATES}
        for entry in logged:
            # What W&B got is what the run's config.yaml records.
            logger = OmegaConf.load(entry["run_dir"] / "config.yaml").logger
            assert (logger.group, logger.name) == (entry["group"], entry["name"])
            metrics = json.loads((entry["run_dir"] / "metrics.json").read_text())
            assert entry["summary"]["main_metric"] == "accuracy"
            assert entry["summary"]["main_value"] == pytest.approx(metrics["main_value"])
            assert entry["summary"]["train/complete"] is True
            assert entry["summary"]["train/planned_steps"] == metrics["train"]["planned_steps"]

    # The workspace of the first launch selects its four runs and none of the second's.
    plan = plan_workspace(read_sweep(tmp_path / "first"), "my-team", "bertkit")
    spec = view_of(build_workspace(plan))
    filters = spec["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert {"key": {"section": "run", "name": "tags"}, "op": "IN",
            "value": ["sweep:multirun-first"]} in [
        {k: condition[k] for k in ("key", "op", "value")} for condition in filters]
    assert [passes(filters, entry) for entry in first + second] == [True] * 4 + [False] * 4

"""bertkit-report --wandb-workspace: the workspace built from a real sweep's W&B logs (offline),
its grouping, filters and panels checked against the keys those runs logged, read here
independently of the command."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertkit.reporting.cli import main
from bertkit.reporting.wandb_log import read_offline_run
from bertkit.reporting.wandb_workspace import WORKSPACE_FILE
from tests.conftest import WORDS, write_glue_task
from tests.test_cli import run_cli

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A real 2 x 2 grid (learning rate x seed) of LLRD finetunes through the CLI, W&B offline,
    evaluated on dev at each step (one sweep for the module's tests)."""
    root = tmp_path_factory.mktemp("workspace")
    data = root / "glue" / "rte"
    write_glue_task("rte", data, 24, 16, 6, random.Random(0))
    vocab = root / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', ".", "?", *sorted(WORDS)]) + "\n")
    sweep_dir = root / "sweep"
    result = run_cli("-m", "recipe=glue", "task=rte", f"task.data_dir={data}",
                     "model=scratch_tiny", f"model.tokenizer={vocab}",
                     "model.config.hidden_size=32", "model.config.intermediate_size=64",
                     "model.config.num_hidden_layers=2", "finetuning=llrd",
                     "logger=wandb", "logger.mode=offline", "seed=1,2",
                     "trainer.learning_rate=1e-3,3e-3", "trainer.max_steps=2",
                     "trainer.per_device_train_batch_size=8", "trainer.save_strategy=no",
                     "trainer.eval_strategy=steps", "trainer.eval_steps=1",
                     "trainer.logging_steps=1", "trainer.disable_tqdm=true",
                     f"hydra.sweep.dir={sweep_dir}", cwd=root, env_extra=OFFLINE)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(list(sweep_dir.rglob("run-*.wandb"))) == 4
    return sweep_dir


def logged_runs(root: Path) -> list[dict]:
    return [read_offline_run(log.parent) for log in sorted(root.rglob("run-*.wandb"))]


def spec_of(root: Path, out: Path, *extra: str) -> dict:
    assert main([str(root), "--wandb-workspace", "my-team/bertkit", "--dry-run",
                 "--out", str(out), *extra]) == 0
    return json.loads((out / WORKSPACE_FILE).read_text())


def panels(spec: dict) -> dict[str, list[dict]]:
    sections = spec["view"]["spec"]["section"]["panelBankConfig"]["sections"]
    return {section["name"]: section["panels"] for section in sections}


def config_value(config: dict, accessor_name: str):
    """A config key as W&B's view names it (learning_rate.value, finetuning.value.name)."""
    top, _, rest = accessor_name.partition(".value")
    value = config[top]
    for part in filter(None, rest.split(".")):
        value = value[part]
    return value


@pytest.mark.slow
def test_a_real_sweeps_workspace_groups_by_grid_point_and_plots_what_it_logged(sweep, tmp_path):
    spec = spec_of(sweep, tmp_path / "out")
    runs = logged_runs(sweep)
    history = set.union(*(run["history_keys"] for run in runs))
    summary = set.union(*(set(run["summary"]) for run in runs))
    run_set = spec["view"]["spec"]["section"]["runSets"][0]

    assert (spec["entity"], spec["project"]) == ("my-team", "bertkit")
    assert spec["view"]["entity"] == "my-team" and spec["view"]["project"] == "bertkit"
    # Filter: the multirun's W&B groups (one per learning rate) and its own sweep tag
    groups = ["multirun-sweep learning_rate:0.001", "multirun-sweep learning_rate:0.003"]
    assert sorted({run["group"] for run in runs}) == groups
    group_filter, tag_filter = run_set["filters"]["filters"]
    assert group_filter["key"] == {"section": "run", "name": "group"}
    assert (group_filter["op"], group_filter["value"]) == ("IN", groups)
    assert tag_filter["key"] == {"section": "run", "name": "tags"}
    assert (tag_filter["op"], tag_filter["value"]) == ("IN", ["sweep:multirun-sweep"])
    assert spec["name"] == "bertkit: multirun-sweep"
    # Grouping: the run's group, then each grid key, every one a key of every run's config;
    # the seed is not among them, so a group holds the seeds of one grid point.
    grouping = run_set["grouping"]
    assert grouping[0] == {"section": "run", "name": "group"}
    config_keys = [key["name"] for key in grouping[1:]]
    assert all(key["section"] == "config" for key in grouping[1:])
    assert config_keys == ["learning_rate.value", "train_batch_size.value",
                           "num_train_epochs.value", "finetuning.value.name"]
    points = {tuple(config_value(run["config"], key) for key in config_keys) for run in runs}
    assert len(points) == 2  # two learning rates, the two seeds of each in one group
    assert {run["config"]["seed"] for run in runs} == {1, 2}
    assert not any(key.startswith("seed") for key in config_keys)

    shown = panels(spec)
    assert list(shown) == ["Grid", "Dev metric per grid point", "Training", "Throughput"]
    # Every line and bar shows the mean over a group's seeds with a standard-deviation band,
    # and every key it plots is one the runs logged.
    for name, section in shown.items():
        for panel in section:
            if panel["viewType"] == "Parallel Coordinates Plot":
                continue
            assert (panel["config"]["groupAgg"], panel["config"]["groupArea"]) == (
                "mean", "stddev"), panel
            for metric in panel["config"]["metrics"]:
                key = metric.removeprefix("summary_metrics.")
                assert key in (summary if metric != key else history), (name, metric)
    line_panels = [panel for section in shown.values() for panel in section
                   if panel["viewType"] == "Run History Line Plot"]
    lines = {panel["config"]["chartTitle"]: panel["config"]["metrics"] for panel in line_panels}
    # Every curve, and the workspace's own x-axis, against Trainer's optimizer step: the step
    # metric its W&B callback defines, which every run logged (not W&B's _step).
    assert "train/global_step" in history
    assert {panel["config"]["xAxis"] for panel in line_panels} == {"train/global_step"}
    assert spec["view"]["spec"]["section"]["settings"]["xAxis"] == "train/global_step"
    assert lines["training loss"] == ["train/loss"]
    # LLRD's learning rate per layer group: embeddings, each layer, the head
    assert lines["learning rate per layer group"] == sorted(
        key for key in history if key.startswith("train/lr/"))
    assert {"train/lr/embeddings", "train/lr/layer_0", "train/lr/layer_1"} <= set(
        lines["learning rate per layer group"])
    assert lines["dev metric during training"] == ["eval/validation_accuracy"]
    assert lines["real tokens per second"] == ["train/throughput/tokens_per_second"]
    bars = {panel["config"]["chartTitle"]: panel["config"]["metrics"]
            for panel in shown["Dev metric per grid point"] if panel["viewType"] == "Bar Chart"}
    assert bars == {"main dev metric (main_value)": ["summary_metrics.main_value"],
                    "dev scores": ["summary_metrics.final/validation/accuracy"]}
    (parallel,) = shown["Grid"]
    assert [column["accessor"] for column in parallel["config"]["columns"]] == [
        "config:learning_rate.value", "config:train_batch_size.value",
        "config:num_train_epochs.value", "config:seed.value", "config:finetuning.value.name",
        "summary:main_value"]
    # A finetuning sweep logged no pretraining curves (and no MFU on a CPU): left out, named.
    assert "Pretraining / MLM loss" in spec["left_out"]
    assert "Throughput / MFU" in spec["left_out"]


def test_a_pretraining_runs_workspace_shows_mlm_and_nsp(pretraining_run, tmp_path):
    run_dir, _ = pretraining_run  # tests.runs
    spec = spec_of(run_dir, tmp_path / "out")
    lines = {panel["config"]["chartTitle"]: panel["config"]["metrics"]
             for panel in panels(spec)["Pretraining"]}
    # the training batches' and the held-out set's, against the step
    assert set(lines["MLM loss"]) == {"train/mlm_loss", "train/heldout/mlm_loss"}
    assert set(lines["MLM accuracy"]) == {"train/mlm_accuracy", "train/heldout/mlm_accuracy"}
    assert "train/nsp_loss" in lines["NSP / SOP loss"]
    assert "train/nsp_accuracy" in lines["NSP / SOP accuracy"]
    (logged,) = logged_runs(run_dir)
    for keys in lines.values():
        assert set(keys) <= logged["history_keys"]
    assert spec["groups"] == ["pretrain-demo"]


@pytest.mark.slow  # reads the module's sweep, which the slow tests above build anyway
def test_a_workspace_in_another_project_or_without_credentials_is_refused(sweep, tmp_path,
                                                                          monkeypatch, capsys):
    assert main([str(sweep), "--wandb-workspace", "my-team/other", "--dry-run",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "logged to W&B project(s) bertkit" in err and "Traceback" not in err
    assert main([str(sweep), "--wandb-workspace", "bertkit", "--dry-run"]) == 2
    assert "expected ENTITY/PROJECT" in capsys.readouterr().err

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with W&B's key
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert main([str(sweep), "--wandb-workspace", "my-team/bertkit",
                 "--out", str(tmp_path / "out")]) == 2
    assert "no W&B credentials" in capsys.readouterr().err
    assert (tmp_path / "out" / WORKSPACE_FILE).is_file()  # the spec is written all the same


def test_a_directory_without_wandb_logs_is_refused(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main([str(tmp_path), "--wandb-workspace", "my-team/bertkit", "--dry-run"]) == 2
    assert "no W&B run logs of bertkit runs" in capsys.readouterr().err

"""Which runs the report pools as seeds: every setting of the real config tree either splits
the rows (the default: any setting may change a result) or is listed in result_neutral.yaml
as the seed, a grid key or result-neutral. The cases are generated from the composed configs,
so a key added to conf/ is covered without a new test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from bertkit.reporting.collect import collect_runs
from bertkit.reporting.identity import RowSplit, flatten, ignored
from bertkit.reporting.sections import render_markdown
from bertkit.reporting.writer import build_report
from tests.conftest import compose_config
from tests.reporting.test_run_results import glue_metrics

# The configs whose keys are generated: a finetune with its defaults, and with each method
# and a time budget (their keys are only composed with them).
COMPOSED = [["recipe=glue", "task=mrpc"], ["recipe=glue", "task=mrpc", "finetuning=lora"],
            ["recipe=glue", "task=mrpc", "finetuning=stilts"],
            ["recipe=squad", "budget.minutes=5"]]


def composed_settings() -> dict[str, object]:
    flat: dict[str, object] = {}
    for overrides in COMPOSED:
        cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
        flat.update(flatten(cfg))
    return flat


SETTINGS = composed_settings()


def other_value(value: object) -> object:
    """A value unlike `value`, of a kind a config could hold there."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if value != -1 else 7
    if isinstance(value, str):
        return value + "_other"
    if isinstance(value, list):
        return [*value, "other"]
    if isinstance(value, dict):
        return {"other": 1}
    return "other"  # null


def write_run(directory: Path, config: dict, seed: int, value: float,
              data_fingerprint: str | None = None) -> None:
    """A finished run as bertkit leaves it: metrics.json and the resolved config.yaml."""
    directory.mkdir(parents=True)
    task = config["task"]["name"]
    metrics = glue_metrics(task, seed, {"validation": {"f1": value, "accuracy": value}})
    if data_fingerprint is not None:
        metrics["details"]["data_fingerprint"] = data_fingerprint
    (directory / "metrics.json").write_text(json.dumps(metrics))
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


def unflatten(flat: dict[str, object]) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def runs_differing_in(tmp_path: Path, key: str) -> list:
    """Two seeds of a base configuration and one run that differs from it in `key` only."""
    base = {**SETTINGS, "task.name": "mrpc"}
    changed = {**base, key: other_value(base[key])}
    root = tmp_path / key
    write_run(root / "base1", unflatten(base), 1, 0.8)
    write_run(root / "base2", unflatten(base), 2, 0.9)
    write_run(root / "changed", unflatten(changed), 3, 0.5)
    runs, _ = collect_runs(root)
    return runs


SPLITTING = sorted(k for k in SETTINGS if not ignored(k) and k != "task.name")
POOLED = sorted(k for k in SETTINGS if ignored(k))


def test_the_keys_the_issue_names_split_rows():
    assert {"trainer.max_steps", "trainer.warmup_steps", "finetuning.layer_lr_decay",
            "model.name_or_path", "trainer.weight_decay", "model.hidden_dropout_prob",
            "finetuning.lora.r", "budget.minutes"} <= set(SPLITTING)
    assert {"seed", "trainer.seed", "logger.name", "logger.group", "trainer.learning_rate",
            "trainer.num_train_epochs", "cache_dir"} <= set(POOLED)


@pytest.mark.parametrize("key", SPLITTING)
def test_a_run_differing_in_any_setting_is_a_row_of_its_own(key, tmp_path):
    runs = runs_differing_in(tmp_path, key)
    split = RowSplit.of(runs)
    # A two-stage run's model is the checkpoint it started from (identity.STARTED_FROM).
    named = "model.name_or_path" if key == "model.started_from" else key
    assert split.keys and all(k == named or k.startswith(named + ".") for k in split.keys)
    rows = {}
    for run in runs:
        rows.setdefault(split.key(run), []).append(run.run_dir.name)
    assert sorted(rows.values()) == [["base1", "base2"], ["changed"]]
    base, changed = (next(r for r in runs if r.run_dir.name == name)
                     for name in ("base1", "changed"))
    assert split.name(base) != split.name(changed)


@pytest.mark.parametrize("key", POOLED)
def test_the_seed_grid_and_neutral_settings_never_split_a_row(key, tmp_path):
    runs = runs_differing_in(tmp_path, key)
    split = RowSplit.of(runs)
    assert split.keys == ()
    assert len({split.key(run) for run in runs}) == 1


def test_the_report_on_a_mixed_sweep(tmp_path):
    """The issue's case: a full run and a 3-step run of one learning rate were one row, "74.9 ±
    35.2 over 2 seeds". Now: rows by max_steps, warm-up, layer decay and model, each named
    by what differs; seeds of one configuration pool; the report names the keys."""
    base = {**SETTINGS, "task.name": "mrpc"}
    arms = {"full": {}, "short": {"trainer.max_steps": 3},
            "warmup": {"trainer.warmup_steps": 0.0},
            "decay": {"finetuning.layer_lr_decay": 0.9},
            "model": {"model.name_or_path": "/home/me/checkpoints/my-bert"}}
    scores = {"full": [0.9975, 0.9950], "short": [0.5], "warmup": [0.95, 0.97],
              "decay": [0.93], "model": [0.6, 0.7]}
    for arm, changes in arms.items():
        for seed, value in enumerate(scores[arm], start=1):
            write_run(tmp_path / "sweep" / arm / f"seed{seed}", unflatten({**base, **changes}),
                      seed, value)
    report = build_report(tmp_path / "sweep", reference_keys=["none"])
    assert report["rows_split_by"]["keys"] == [
        "model.name_or_path", "finetuning.layer_lr_decay", "trainer.max_steps",
        "trainer.warmup_steps"]
    assert report["rows_split_by"]["unknown"] == []
    rows = {s["system"]: s["tasks"]["mrpc"]["values"] for s in report["systems"]}
    # each name: the model and what differs from the value most rows have
    assert rows == {"bert-base-uncased": [0.9975, 0.9950],
                    "bert-base-uncased · max_steps=3": [0.5],
                    "bert-base-uncased · warmup_steps=0": [0.95, 0.97],
                    "bert-base-uncased · layer_lr_decay=0.9": [0.93],
                    "my-bert": [0.6, 0.7]}
    assert report["rows_split_by"]["common"] == {"finetuning.layer_lr_decay": "1",
                                                 "trainer.max_steps": "-1",
                                                 "trainer.warmup_steps": "0.1"}
    table = report["table_markdown"]
    assert "/home/me" not in table and "99.6 ± 0.2" in table
    md = render_markdown(report)
    assert ("`model.name_or_path`, `finetuning.layer_lr_decay`, `trainer.max_steps`, "
            "`trainer.warmup_steps`") in md
    assert ("left out, those values are: `finetuning.layer_lr_decay`=1, `trainer.max_steps`=-1, "
            "`trainer.warmup_steps`=0.1.") in md


def test_runs_that_do_not_record_a_setting_are_named_and_kept_apart(tmp_path):
    """A run without config.yaml (metrics.json only) cannot be compared on config keys: it is
    a row of its own and the report says which keys it could not tell."""
    base = {**SETTINGS, "task.name": "mrpc"}
    write_run(tmp_path / "new" / "seed1", unflatten(base), 1, 0.9)
    old = tmp_path / "old" / "seed2"
    old.mkdir(parents=True)
    (old / "metrics.json").write_text(json.dumps(
        glue_metrics("mrpc", 2, {"validation": {"f1": 0.5, "accuracy": 0.5}})))
    report = build_report(tmp_path, reference_keys=["none"])
    assert len(report["systems"]) == 2
    facts = report["rows_split_by"]
    assert "trainer.max_steps" in facts["unknown"] and "max_steps" in facts["unknown"]
    assert facts["runs_without_unknown"] == 2
    assert facts["settings_sources"] == {"config.yaml": 1, "metrics.json": 1}
    assert "**Cannot tell** whether 2 run(s) differ in" in render_markdown(report)


@pytest.mark.slow
def test_compare_groups_never_pool_two_rows(tmp_path):
    """--compare 'a/*' 'b/*' where a/ holds two configurations: A's values are the seeds of
    its best one, not of both."""
    base = {**SETTINGS, "task.name": "mrpc"}
    for seed, value in ((1, 0.80), (2, 0.82), (3, 0.81)):
        write_run(tmp_path / "a" / "long" / f"s{seed}", unflatten(base), seed, value)
        write_run(tmp_path / "a" / "short" / f"s{seed}",
                  unflatten({**base, "trainer.max_steps": 3}), seed, value - 0.3)
        write_run(tmp_path / "b" / f"s{seed}", unflatten({**base, "trainer.warmup_steps": 0.0}),
                  seed, value + 0.01)
    report = build_report(tmp_path, compare=[("a/*", "b/*")], reference_keys=["none"])
    result = report["comparisons"][0]["tasks"]["mrpc"]
    assert sorted(result["a"]["values"]) == [0.80, 0.81, 0.82]
    assert result["a"]["rows_in_group"] == 2
    assert result["a"]["system"] == "bert-base-uncased"  # the common values: max_steps -1
    md = render_markdown(report)
    assert ("A matches runs of 2 rows; its best configuration is `bert-base-uncased`, the "
            "others are not pooled in.") in md
    assert result["mean_a"] == pytest.approx(0.81)


def test_downstream_finetunes_pool_by_their_pretraining_arm(tmp_path):
    """An ablation's downstream finetunes: each seed's checkpoint has its own path, and the
    pretraining's seed differs too; rows are the pretraining arms (masking x objective), each
    pooling its seeds, named by the arm's choices (issue 61)."""
    scores = {("static", "mlm_nsp"): [0.55, 0.57], ("dynamic", "mlm_nsp"): [0.60, 0.62],
              ("dynamic", "mlm"): [0.50, 0.52]}
    for (masking, objective), values in scores.items():
        for seed, value in enumerate(values, start=1):
            job = tmp_path / "ablation" / f"{masking}-{objective}" / f"seed{seed}"
            pretraining = OmegaConf.to_container(compose_config(
                ["recipe=pretrain", f"masking={masking}", f"objective={objective}",
                 f"seed={seed}"]), resolve=True)
            job.mkdir(parents=True)
            (job / "config.yaml").write_text(yaml.safe_dump(pretraining))
            (job / "metrics.json").write_text(json.dumps(
                {"recipe": "pretrain", "masking": masking, "objective": objective,
                 "corpus": "demo"}))
            finetune = OmegaConf.to_container(compose_config(
                ["recipe=glue", "task=rte", f"model.name_or_path={job / 'model'}",
                 f"seed={seed}"]), resolve=True)
            downstream = job / "downstream" / "rte"
            downstream.mkdir(parents=True)
            (downstream / "config.yaml").write_text(yaml.safe_dump(finetune))
            (downstream / "metrics.json").write_text(json.dumps(glue_metrics(
                "rte", seed, {"validation": {"accuracy": value}})))
    report = build_report(tmp_path / "ablation", reference_keys=["none"])
    rows = {s["system"]: s["tasks"]["rte"]["values"] for s in report["systems"]}
    # named by the settings the arms differ in alone, as the pretraining table's rows
    assert rows == {"masking=static · objective=mlm_nsp": [0.55, 0.57],
                    "masking=dynamic · objective=mlm_nsp": [0.60, 0.62],
                    "masking=dynamic · objective=mlm": [0.50, 0.52]}


def test_a_list_setting_is_one_cell(tmp_path):
    """finetuning.lora.target_modules=[query,key,value] vs the default list: each row of
    report.md's table and of results.csv stays on one line."""
    base = {**SETTINGS, "task.name": "mrpc"}
    write_run(tmp_path / "a" / "s1", unflatten(base), 1, 0.8)
    write_run(tmp_path / "b" / "s1", unflatten(
        {**base, "finetuning.lora.target_modules": ["query", "key", "value"]}), 1, 0.9)
    report = build_report(tmp_path, reference_keys=["none"])
    names = sorted(s["system"] for s in report["systems"])
    assert names == ["bert-base-uncased · target_modules=[query, key, value]",
                     "bert-base-uncased · target_modules=[query, value]"]
    table = report["table_markdown"].splitlines()
    assert len(table) == 4 and all(line.startswith("| ") for line in table)
    assert len(report["table_csv"].splitlines()) == 3


def test_the_same_data_under_two_paths_is_one_row(tmp_path):
    """Runs that record their data's content (details.data_fingerprint) are compared on it,
    not on the path they were given: ../data/MRPC and /abs/data/MRPC with the same files
    pool; other files under the same path do not. Without fingerprints the paths split."""
    base = {**SETTINGS, "task.name": "mrpc"}
    for name, path, fingerprint, seed in (("rel", "../data/MRPC", "aaaa", 1),
                                          ("abs", "/abs/data/MRPC", "aaaa", 2),
                                          ("other", "/abs/data/MRPC", "bbbb", 3)):
        write_run(tmp_path / "fp" / name, unflatten({**base, "task.data_dir": path}), seed,
                  0.8, data_fingerprint=fingerprint)
        write_run(tmp_path / "paths" / name, unflatten({**base, "task.data_dir": path}), seed,
                  0.8)
    runs, _ = collect_runs(tmp_path / "fp")
    split = RowSplit.of(runs)
    assert split.keys == ("data.fingerprint",)
    rows = {}
    for run in runs:
        rows.setdefault(split.key(run), []).append(run.run_dir.name)
    assert sorted(rows.values()) == [["abs", "rel"], ["other"]]
    runs, _ = collect_runs(tmp_path / "paths")
    split = RowSplit.of(runs)
    assert split.keys == ("task.data_dir",) and len({split.key(r) for r in runs}) == 2

"""A tiny end-to-end finetune for every GLUE task: random-init 2-layer BERT, generated files
in the original layout, a handful of steps; checks every file a run must leave behind."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from bertkit.jobs import run_job
from bertkit.tasks.glue.metrics import compute_metrics
from tests.conftest import GLUE_TASKS, compose_config
from tests.glue_fixtures import LABELS
from tests.runs import GLUE_SIZES, GLUE_STEPS

VALIDATION = {"mnli": ["validation_matched", "validation_mismatched"]}
LEADERBOARD = {"cola": ["CoLA.tsv"], "sst2": ["SST-2.tsv"], "mrpc": ["MRPC.tsv"],
               "stsb": ["STS-B.tsv"], "qqp": ["QQP.tsv"], "mnli": ["MNLI-m.tsv", "MNLI-mm.tsv"],
               "qnli": ["QNLI.tsv"], "rte": ["RTE.tsv"], "wnli": ["WNLI.tsv"]}
METRIC_KEYS = {"cola": {"matthews_correlation"}, "sst2": {"accuracy"},
               "mrpc": {"f1", "accuracy"}, "stsb": {"pearson", "spearman"},
               "qqp": {"f1", "accuracy"}, "mnli": {"accuracy"}, "qnli": {"accuracy"},
               "rte": {"accuracy"}, "wnli": {"accuracy"}}


def read_tsv(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_tiny_finetune_writes_every_result(task, glue_task_run):
    """The shared run of the task (tests.runs.glue_task_run)."""
    _, n_dev, n_test = GLUE_SIZES
    run_dir, _, data = glue_task_run(task)
    cfg = compose_config(["recipe=glue", f"task={task}"])

    metrics = json.loads((run_dir / "metrics.json").read_text())
    splits = VALIDATION.get(task, ["validation"])
    assert set(metrics["validation"]) == set(splits)
    for split in splits:
        assert set(metrics["validation"][split]) == METRIC_KEYS[task]
        assert all(np.isfinite(v) for v in metrics["validation"][split].values())
    assert metrics["main_value"] == metrics["validation"][splits[0]][cfg.task.main_metric]
    assert metrics["train"]["steps"] == GLUE_STEPS
    assert metrics["hyperparameters"]["max_seq_length"] == 128

    labels = LABELS[task]
    for split in splits:
        rows = read_tsv(run_dir / "predictions" / f"{split}.tsv")
        assert rows[0] == ["index", "label", "prediction"]
        assert [int(r[0]) for r in rows[1:]] == list(range(n_dev))
        gold_file = "dev.tsv" if task != "mnli" else split.replace("validation", "dev") + ".tsv"
        if labels is not None:
            assert {r[2] for r in rows[1:]} <= set(labels)
            # The gold labels in the prediction file are the file's own labels, in file order.
            gold_column = {"cola": 1, "sst2": 1, "mrpc": 0, "qqp": 5, "mnli": 11}.get(task, 3)
            file_rows = read_tsv(data / gold_file)
            file_rows = file_rows if task == "cola" else file_rows[1:]
            assert [r[1] for r in rows[1:]] == [r[gold_column] for r in file_rows]
            # metrics.json agrees with a recomputation from the written predictions.
            pred = np.array([labels.index(r[2]) for r in rows[1:]])
            gold = np.array([labels.index(r[1]) for r in rows[1:]])
        else:
            pred = np.array([float(r[2]) for r in rows[1:]])
            gold = np.array([float(r[1]) for r in rows[1:]])
        recomputed = compute_metrics(list(cfg.task.metrics), pred, gold)
        for key, value in recomputed.items():
            assert metrics["validation"][split][key] == pytest.approx(value, abs=1e-5)

    for name in LEADERBOARD[task]:
        rows = read_tsv(run_dir / "leaderboard" / name)
        assert rows[0] == ["index", "prediction"]
        assert [int(r[0]) for r in rows[1:]] == list(range(n_test))
        if labels is not None:
            assert {r[1] for r in rows[1:]} <= set(labels)
        else:
            assert all(np.isfinite(float(r[1])) for r in rows[1:])

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["task"]["name"] == task
    assert "${" not in (run_dir / "config.yaml").read_text()
    assert (run_dir / "model" / "config.json").is_file()
    assert not list(run_dir.rglob("*.tmp"))


@pytest.mark.slow
def test_demo_recipe_learns_its_task(tmp_path):
    """The embedded default end to end: a from-scratch BERT must actually learn the cue-word
    rule (a broken vocabulary or label path leaves it at the 0.5 of a constant guess)."""
    cfg = compose_config(["logger=none", "trainer.disable_tqdm=true",
                          "trainer.save_strategy=no", "trainer.eval_strategy=no"])
    run_job(cfg, run_dir=tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["validation"]["validation"]["accuracy"] > 0.9
    assert metrics["train"]["loss"] < 0.5
    assert len(read_tsv(tmp_path / "run" / "leaderboard" / "DEMO.tsv")) == 1 + 200

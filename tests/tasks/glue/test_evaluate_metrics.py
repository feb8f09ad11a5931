"""task.metrics may name an `evaluate` module beside the built-ins: loaded from a local path
(the test writes one), computed on the dev predictions, recorded in metrics.json; a module
that cannot load is one message naming the entry."""

from __future__ import annotations

import csv
import json
import textwrap

import numpy as np
import pytest
from omegaconf import OmegaConf

from bertkit.errors import BertkitError
from bertkit.jobs import run_job
from bertkit.tasks.glue.metrics import task_metrics
from tests.conftest import compose_config, tiny_run_overrides

MODULE = textwrap.dedent('''
    import datasets
    import evaluate


    class WrongCount(evaluate.Metric):
        """How many predictions miss, and the share of positive predictions."""

        def _info(self):
            return evaluate.MetricInfo(
                description="test metric", citation="", inputs_description="",
                features=datasets.Features({"predictions": datasets.Value("int64"),
                                            "references": datasets.Value("int64")}))

        def _compute(self, predictions, references, weight=1):
            wrong = sum(p != r for p, r in zip(predictions, references))
            return {"wrong": weight * wrong,
                    "positive_share": sum(p == 1 for p in predictions) / len(predictions)}
''')


@pytest.fixture
def module_path(tmp_path):
    directory = tmp_path / "wrong_count"
    directory.mkdir()
    (directory / "wrong_count.py").write_text(MODULE)
    return directory / "wrong_count.py"


def task(metrics: list) -> OmegaConf:
    return OmegaConf.create({"metrics": metrics})


def test_local_module_beside_built_ins(module_path):
    compute = task_metrics(task(["accuracy", {"evaluate": str(module_path),
                                              "kwargs": {"weight": 10}}]))
    predictions, gold = np.array([1, 0, 1, 1, 0]), np.array([1, 1, 0, 1, 0])
    assert compute(predictions, gold) == {"accuracy": 0.6, "wrong": 20.0,
                                          "positive_share": 0.6}


@pytest.mark.parametrize(("entry", "message"), [
    ({"evaluate": "/nowhere/no_metric.py"}, r"task.metrics\[1\]: could not load the evaluate "
                                            r"module '/nowhere/no_metric.py'"),
    ({"evaluate": "x", "typo": 1}, r"task.metrics\[1\]=.*expected \{evaluate: <Hub name or "
                                   r"path>\}"),
])
def test_a_module_that_cannot_load_is_one_message(entry, message):
    with pytest.raises(BertkitError, match=message):
        task_metrics(task(["accuracy", entry]))


def test_a_main_metric_no_entry_computes_is_refused(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir))
    cfg.task.metrics = ["accuracy"]
    with pytest.raises(BertkitError, match=r"task.main_metric=f1 is not among task.metrics"):
        run_job(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a run
def test_finetune_records_the_module_scores(module_path, glue_dir, vocab_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir)
    cfg = compose_config(overrides)
    cfg.task.metrics = ["accuracy", "f1", {"evaluate": str(module_path)}]
    run_job(cfg, run_dir=run_dir)
    scores = json.loads((run_dir / "metrics.json").read_text())["validation"]["validation"]
    with open(run_dir / "predictions" / "validation.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    wrong = sum(row["label"] != row["prediction"] for row in rows)
    assert scores["wrong"] == wrong
    assert scores["accuracy"] == pytest.approx(1 - wrong / len(rows))
    labels = list(cfg.task.labels)
    assert scores["positive_share"] == pytest.approx(
        sum(labels.index(row["prediction"]) == 1 for row in rows) / len(rows))

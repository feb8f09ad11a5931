"""--compare's KEY=VALUE selections: keys as the report names them, values as the configs hold
them, and a side that matches nothing told in one line with what exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bertkit.errors import BertkitError
from bertkit.reporting.collect import collect_runs
from bertkit.reporting.selection import is_selection, resolve_side, split_items
from bertkit.reporting.writer import relative_dir
from tests.reporting.test_run_results import glue_metrics, write


@pytest.fixture
def runs(tmp_path):
    """Four runs with config.yaml: two methods x two learning rates, lower_case true."""
    root = tmp_path / "outputs"
    for method in ("full", "llrd"):
        for number, lr in enumerate((2e-5, 1e-3)):
            run_dir = root / "rte" / f"{method}{number}"
            write(run_dir / "metrics.json",
                  glue_metrics("rte", 1, {"validation": {"accuracy": 0.6}}, lr=lr))
            config = {"seed": 1, "trainer": {"learning_rate": lr, "num_train_epochs": 3},
                      "finetuning": {"name": method, "layer_lr_decay": 0.9 if method == "llrd"
                                     else 1.0, "r3f": {"eps": 1e-5}},
                      "throughput": {"eps": 0.1},
                      "logger": {"name": f"rte-{method}{number}"},
                      "task": {"name": "rte", "lower_case": True, "data_dir": "/data/RTE"},
                      "model": {"name_or_path": "bert-base-uncased"}}
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return root, collect_runs(root)[0]


def chosen(side: str, root: Path, found) -> list[str]:
    return sorted(r.run_dir.name for r in resolve_side(side, found, root, relative_dir)[1])


@pytest.mark.parametrize(("side", "expected"), [
    ("finetuning=llrd", ["llrd0", "llrd1"]),  # a group for its choice
    ("finetuning.name=llrd", ["llrd0", "llrd1"]),  # the full key
    ("name=llrd", ["llrd0", "llrd1"]),  # logger.name too, but the runs differ by finetuning's
    ("learning_rate=0.00002", ["full0", "llrd0"]),  # a suffix; 2e-05 as the config holds it
    ("trainer.learning_rate=2e-5", ["full0", "llrd0"]),
    ("layer_lr_decay=1", ["full0", "full1"]),  # 1 and 1.0 alike
    ("finetuning=llrd learning_rate=1e-3", ["llrd1"]),  # several, by spaces
    ("finetuning=llrd,learning_rate=1e-3", ["llrd1"]),  # or by commas (a job's directory)
    ("lower_case=True", ["full0", "full1", "llrd0", "llrd1"]),  # true, True, TRUE alike
    ("task.data_dir=/data/RTE", ["full0", "full1", "llrd0", "llrd1"]),
])
def test_selection_matches_by_setting(runs, side, expected):
    root, found = runs
    assert is_selection(side)
    assert chosen(side, root, found) == expected


def test_globs_are_not_selections():
    for glob in ("rte/*", "*llrd*", "rte/finetuning=llrd,seed=2", "rte/[0-3]", "full/*"):
        assert not is_selection(glob)
    assert split_items("lora.target_modules=[query,value] seed=1") == [
        "lora.target_modules=[query,value]", "seed=1"]


def test_a_side_without_runs_says_what_exists(runs):
    root, found = runs
    with pytest.raises(BertkitError) as err:
        chosen("learning_rate=3e-5", root, found)
    assert str(err.value) == ("--compare: no run has trainer.learning_rate=3e-05; its values: "
                              "2e-05, 0.001")
    with pytest.raises(BertkitError) as err:
        chosen("finetuning=full layer_lr_decay=0.9", root, found)
    assert str(err.value) == ("--compare: no run has finetuning.layer_lr_decay=0.9 among the "
                              "runs with finetuning.name=full; its values: 1")
    with pytest.raises(BertkitError) as err:
        chosen("masking=static", root, found)
    assert str(err.value) == ("--compare: no setting 'masking' in the runs' configs; the runs "
                              "differ by: finetuning.layer_lr_decay, finetuning.name, "
                              "trainer.learning_rate")
    with pytest.raises(BertkitError) as err:
        chosen("eps=0.1", root, found)  # throughput.eps cannot change a result
    assert str(err.value) == ("--compare: no run has finetuning.r3f.eps=0.1; its values: "
                              "1e-05")
    with pytest.raises(BertkitError) as err:
        chosen("rte/*lora*", root, found)
    assert str(err.value).endswith("run directories: rte/full0, rte/full1, rte/llrd0, "
                                   "rte/llrd1")

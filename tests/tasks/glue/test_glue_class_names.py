"""The saved model of every GLUE classification task names its classes as GLUE and nyu-mll/glue
do (not '0'/'1'): a tiny run of each task conf, its saved model directory loaded in
transformers' text-classification pipeline; while the prediction and leaderboard files keep
the files' own label strings, GLUE's submission format."""

from __future__ import annotations

import csv

import pytest
from transformers import AutoConfig, pipeline

from bertkit.errors import BertkitError
from bertkit.tasks.glue.data import class_names
from tests.conftest import compose_config, glue_classification_tasks

# The class names of nyu-mll/glue's label features (ClassLabel), by Hub class id.
HUB_CLASS_NAMES = {
    "cola": ["unacceptable", "acceptable"],
    "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"],
    "wnli": ["not_entailment", "entailment"],
}
# The five whose files write '0'/'1': class id -> name (GLUE's: 1 is the positive class).
BINARY_FILE_TASKS = {task: names for task, names in HUB_CLASS_NAMES.items()
                     if task in {"cola", "sst2", "mrpc", "qqp", "wnli"}}


def read_tsv(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_the_task_list_comes_from_the_conf_files():
    assert set(HUB_CLASS_NAMES) | {"demo"} <= set(glue_classification_tasks())
    assert "stsb" not in glue_classification_tasks()  # regression: no classes


@pytest.mark.parametrize("task", glue_classification_tasks())
def test_class_names_are_glue_names_in_the_file_labels_order(task):
    cfg = compose_config(["recipe=glue", f"task={task}"]).task
    names = class_names(cfg)
    if task in HUB_CLASS_NAMES:
        assert sorted(names) == sorted(HUB_CLASS_NAMES[task])
        assert list(cfg.hub.labels) == HUB_CLASS_NAMES[task]
    if task in BINARY_FILE_TASKS:
        # The files' label strings (and so the class ids) stay '0'/'1'; '1' is GLUE's
        # positive class (acceptable, positive, equivalent, duplicate, entailment).
        assert list(cfg.labels) == ["0", "1"]
        assert names == BINARY_FILE_TASKS[task]
    assert all(not name.isdigit() for name in names)


@pytest.mark.parametrize("task", glue_classification_tasks())
def test_saved_model_shows_the_class_names_in_a_pipeline(task, glue_task_run, hub_offline):
    """The shared run of the task (tests.runs.glue_task_run)."""
    cfg = compose_config(["recipe=glue", f"task={task}"])
    names = class_names(cfg.task)
    run_dir, _, _ = glue_task_run(task)
    model_dir = run_dir / "model"

    config = AutoConfig.from_pretrained(model_dir)
    assert config.id2label == dict(enumerate(names))
    assert config.label2id == {name: i for i, name in enumerate(names)}
    classifier = pipeline("text-classification", model=str(model_dir),
                          tokenizer=str(model_dir), device="cpu")
    text = {"text": "the cat sat on the mat ."}
    if cfg.task.columns.text_b:
        text["text_pair"] = "a dog ran fast ."
    scores = classifier(text, top_k=None)
    assert sorted(score["label"] for score in scores) == sorted(names)
    assert classifier(text)["label"] in names  # one input: one (the top) result

    # The prediction and leaderboard files still write the files' label strings ('0'/'1'
    # for CoLA, SST-2, MRPC, QQP, WNLI), in GLUE's submission format.
    file_labels = list(cfg.task.labels)
    for path in sorted((run_dir / "predictions").glob("*.tsv")):
        rows = read_tsv(path)
        assert rows[0] == ["index", "label", "prediction"]
        assert {value for row in rows[1:] for value in row[1:]} <= set(file_labels)
    leaderboard = sorted((run_dir / "leaderboard").glob("*.tsv"))
    assert [path.name for path in leaderboard] == sorted(cfg.task.leaderboard_files.values())
    for path in leaderboard:
        rows = read_tsv(path)
        assert rows[0] == ["index", "prediction"]
        assert [int(row[0]) for row in rows[1:]] == list(range(len(rows) - 1))
        assert {row[1] for row in rows[1:]} <= set(file_labels)


def test_saved_mrpc_model_says_equivalent_or_not(glue_task_run, hub_offline):
    """The issue's case: MRPC's pipeline labels were '0'/'1' (LABEL_1-style); the shared run."""
    run_dir, _, _ = glue_task_run("mrpc")
    classifier = pipeline("text-classification", model=str(run_dir / "model"),
                          tokenizer=str(run_dir / "model"), device="cpu")
    pair = {"text": "the man was playing guitar .", "text_pair": "a man is playing guitar ."}
    assert {score["label"] for score in classifier(pair, top_k=None)} == {
        "equivalent", "not_equivalent"}
    # The dev predictions keep MRPC's '0'/'1'.
    rows = read_tsv(run_dir / "predictions" / "validation.tsv")
    assert {row[2] for row in rows[1:]} <= {"0", "1"}


@pytest.mark.parametrize(("override", "message"), [
    ("task.class_names=[unacceptable]", r"expected 2 distinct names, one per entry of "
                                        r"task.labels \['0', '1'\]"),
    ("task.class_names=[a,a]", r"expected 2 distinct names"),
    ("task.class_names=null", r"task.class_names is null for the classification task cola"),
])
def test_bad_class_names_are_refused(override, message):
    task = compose_config(["recipe=glue", "task=cola", override]).task
    with pytest.raises(BertkitError, match=message):
        class_names(task)


def test_regression_has_no_class_names():
    task = compose_config(["recipe=glue", "task=stsb"]).task
    assert class_names(task) is None
    with pytest.raises(BertkitError, match=r"task.labels is null"):
        class_names(compose_config(["recipe=glue", "task=stsb",
                                    "task.class_names=[low,high]"]).task)

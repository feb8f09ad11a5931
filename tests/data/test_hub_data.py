"""The Hub code path (nyu-mll/glue) without network: label ids mapped to the task's classes by
name, hidden test labels dropped, and a clear message when the Hub cannot be reached."""

from __future__ import annotations

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue import data as glue_data
from tests.conftest import compose_config
from tests.tasks.glue.test_glue_class_names import HUB_CLASS_NAMES


def hub_mnli() -> datasets.DatasetDict:
    # nyu-mll/glue mnli: 0 entailment, 1 neutral, 2 contradiction; test labels are -1.
    def split(labels):
        return datasets.Dataset.from_dict({
            "premise": [f"p{i}" for i in range(len(labels))],
            "hypothesis": [f"h{i}" for i in range(len(labels))],
            "label": labels, "idx": list(range(len(labels)))})
    return datasets.DatasetDict({"train": split([0, 1, 2, 0]),
                                 "validation_matched": split([2, 2, 1]),
                                 "validation_mismatched": split([0]),
                                 "test_matched": split([-1, -1])})


def test_hub_labels_become_task_labels(monkeypatch):
    calls = []
    monkeypatch.setattr(glue_data.datasets, "load_dataset",
                        lambda *args: calls.append(args) or hub_mnli())
    task = compose_config(["recipe=glue", "task=mnli"]).task
    splits = glue_data.load_glue_splits(task)
    assert calls == [("nyu-mll/glue", "mnli")]
    names = list(task.labels)  # contradiction, entailment, neutral (the files' order)
    assert [names[i] for i in splits["train"]["label"]] == [
        "entailment", "neutral", "contradiction", "entailment"]
    assert [names[i] for i in splits["validation_matched"]["label"]] == [
        "contradiction", "contradiction", "neutral"]
    assert "label" not in splits["test_matched"].column_names
    assert splits["train"]["text_b"] == ["h0", "h1", "h2", "h3"]


def test_unreachable_hub_gives_one_message(monkeypatch):
    def offline(*args):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setattr(glue_data.datasets, "load_dataset", offline)
    task = compose_config(["recipe=glue", "task=rte"]).task
    with pytest.raises(BertkitError, match=r"nyu-mll/glue/rte.*task.data_dir"):
        glue_data.load_glue_splits(task)


def hub_glue(task, hub_names: list[str] | None) -> datasets.DatasetDict:
    """A copy of nyu-mll/glue's `task` whose label column is a ClassLabel naming hub_names
    (None: plain integers); every class id once in train, the reverse in validation."""
    columns = {name: column for name, column in task.hub.columns.items() if column}
    n = len(task.hub.labels)
    features = datasets.Features({
        **{column: datasets.Value("string") for column in columns.values()},
        "label": datasets.ClassLabel(names=hub_names) if hub_names else datasets.Value("int64"),
        "idx": datasets.Value("int32")})

    def split(labels):
        return datasets.Dataset.from_dict(
            {**{column: [f"{column} {i}" for i in range(len(labels))]
                for column in columns.values()},
             "label": labels, "idx": list(range(len(labels)))}, features=features)
    ids = list(range(n))
    return datasets.DatasetDict({"train": split(ids), "validation": split(ids[::-1])})


@pytest.mark.parametrize("task_name", sorted(HUB_CLASS_NAMES))
@pytest.mark.parametrize("class_label", [True, False])
def test_hub_class_ids_become_the_task_class_with_that_name(task_name, class_label,
                                                              monkeypatch):
    """nyu-mll/glue names its classes (ClassLabel; task.hub.labels where a copy does not):
    each Hub id becomes the task's class of the same name, the files' id for that class."""
    task = compose_config(["recipe=glue", f"task={task_name}"]).task
    hub_names = HUB_CLASS_NAMES[task_name]
    monkeypatch.setattr(glue_data.datasets, "load_dataset",
                        lambda *args: hub_glue(task, hub_names if class_label else None))
    splits = glue_data.load_glue_splits(task)
    names = list(task.class_names)
    assert [names[i] for i in splits["train"]["label"]] == hub_names
    assert [names[i] for i in splits["validation"]["label"]] == hub_names[::-1]


def test_hub_class_names_the_task_does_not_have(monkeypatch):
    task = compose_config(["recipe=glue", "task=mrpc"]).task
    monkeypatch.setattr(glue_data.datasets, "load_dataset",
                        lambda *args: hub_glue(task, ["0", "1"]))
    with pytest.raises(BertkitError, match=r"the label names of the Hub dataset nyu-mll/glue/mrpc "
                                           r"\['0', '1'\]: \['0', '1'\] not among the task's "
                                           r"class names \['not_equivalent', 'equivalent'\] "
                                           r"\(task.class_names\)"):
        glue_data.load_glue_splits(task)

"""The Hub code path (nyu-mll/glue) without network: label ids mapped to the task's label
names, hidden test labels dropped, and a clear message when the Hub cannot be reached."""

from __future__ import annotations

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue import data as glue_data
from tests.conftest import compose_config


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

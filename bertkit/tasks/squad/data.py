"""The SQuAD splits of a run (train, validation) from the task config: the original JSON files
(task.data_dir in the release layout, or task.train_file / task.validation_file), or the Hub.

Each split carries a fingerprint of its content and reading rules, so that its windows are
tokenised once and shared by every run and sweep job that reads the same data.
"""

from __future__ import annotations

import datasets
from omegaconf import DictConfig

from bertkit.data.fingerprints import content_fingerprint
from bertkit.data.split_files import split_files
from bertkit.tasks.glue.data import uses_local_files
from bertkit.tasks.squad.files import read_squad_json, squad_from_hub

SPLITS = ("train", "validation")


def load_squad_splits(task: DictConfig, data_source: str = "auto") -> dict[str, datasets.Dataset]:
    """{"train", "validation"} -> examples in the shared schema (bertkit.tasks.squad.files), each
    with a `bertkit_fingerprint` attribute."""
    splits: dict[str, datasets.Dataset] = {}
    if uses_local_files(task, data_source):
        for split, path in split_files(task, SPLITS, "the original release").items():
            rule = task.on_bad_answer_start[split]
            table = read_squad_json(path, version=task.version, on_bad_answer_start=rule)
            table.bertkit_fingerprint = content_fingerprint(task.version, rule, path.read_bytes())
            splits[split] = table
        return splits
    for split in SPLITS:
        table = squad_from_hub(task.hub.path, split)
        table.bertkit_fingerprint = content_fingerprint(task.version, table._fingerprint)
        splits[split] = table
    return splits

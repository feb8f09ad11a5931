"""The SQuAD splits of a run (train, validation) from the task config: the original JSON files
(task.data_dir in the release layout, or task.train_file / task.validation_file), or the Hub.

Each split has a fingerprint of its content and reading rules (version, on_bad_answer_start),
so that its windows are tokenised once and shared by every run and sweep job that reads the
same data.
"""

from __future__ import annotations

from omegaconf import DictConfig

from bertkit.data.cache import content_fingerprint
from bertkit.data.task_data import TaskSplits, split_files, uses_local_files
from bertkit.tasks.squad.files import read_squad_json, squad_from_hub

SPLITS = ("train", "validation")


def load_squad_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    """{"train", "validation"} -> examples in the shared schema (bertkit.tasks.squad.files),
    with a fingerprint of each split."""
    tables, fingerprints = {}, {}
    if uses_local_files(task, data_source):
        for split, path in split_files(task, SPLITS, "the original release").items():
            rule = task.on_bad_answer_start[split]
            tables[split] = read_squad_json(path, version=task.version, on_bad_answer_start=rule)
            fingerprints[split] = content_fingerprint(task.version, rule, path.read_bytes())
        return TaskSplits(tables, fingerprints)
    for split in SPLITS:
        tables[split] = squad_from_hub(task.hub.path, split)
        fingerprints[split] = content_fingerprint(task.version, tables[split]._fingerprint)
    return TaskSplits(tables, fingerprints)

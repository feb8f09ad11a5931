"""The SQuAD splits of a run (train, validation) from the task config: the original JSON files
(task.data_dir in the release layout, or task.train_file / task.validation_file), or the Hub.

Each split carries a fingerprint of its content and reading rules, so that its windows are
tokenised once and shared by every run and sweep job that reads the same data.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets
from omegaconf import DictConfig

from bertkit.errors import BertkitError
from bertkit.glue_data import uses_local_files
from bertkit.squad_files import read_squad_json, squad_from_hub

SPLITS = ("train", "validation")


def local_split_files(task: DictConfig) -> dict[str, Path]:
    """Split -> file: task.data_dir with task.files, then task.<split>_file on top."""
    files: dict[str, Path] = {}
    for split in SPLITS:
        single = task[f"{split}_file"]
        if single:
            path, key = Path(single), f"task.{split}_file"
        elif task.data_dir:
            if not Path(task.data_dir).is_dir():
                raise BertkitError(f"task.data_dir={task.data_dir}: no such directory")
            path, key = Path(task.data_dir) / task.files[split], "task.data_dir"
        else:
            raise BertkitError(f"task {task.name}: no {split} file (task.data_dir or "
                               f"task.{split}_file)")
        if not path.is_file():
            raise BertkitError(f"{key}: {path} not found (the {split} split of {task.name}, "
                               f"{task.files[split]} in the original release)")
        files[split] = path
    return files


def _fingerprint(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def load_squad_splits(task: DictConfig, data_source: str = "auto") -> dict[str, datasets.Dataset]:
    """{"train", "validation"} -> examples in the shared schema (bertkit.squad_files), each
    with a `bertkit_fingerprint` attribute."""
    splits: dict[str, datasets.Dataset] = {}
    if uses_local_files(task, data_source):
        for split, path in local_split_files(task).items():
            rule = task.on_bad_answer_start[split]
            table = read_squad_json(path, version=task.version, on_bad_answer_start=rule)
            table.bertkit_fingerprint = _fingerprint(task.version, rule, path.read_bytes())
            splits[split] = table
        return splits
    for split in SPLITS:
        table = squad_from_hub(task.hub.path, split)
        table.bertkit_fingerprint = _fingerprint(task.version, table._fingerprint)
        splits[split] = table
    return splits

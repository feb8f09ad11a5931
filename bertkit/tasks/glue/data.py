"""GLUE-style splits from the Hub or from local files, as TaskSplits with columns text_a,
text_b (pair tasks), label (class id or float; absent on unlabelled test splits), idx."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
from omegaconf import DictConfig, OmegaConf

from bertkit.data.hub import load_hub_dataset
from bertkit.data.sources import SINGLE_FILE_KEYS, uses_local_files
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.glue.files import read_glue_file


def is_test_split(split: str) -> bool:
    return split.startswith("test")


def is_validation_split(split: str) -> bool:
    return split.startswith("validation")


def local_split_files(task: DictConfig) -> dict[str, Path]:
    """Split name -> file: task.data_dir in the GLUE layout, then task.*_file on top.

    A single task.validation_file replaces every validation split of the layout (MNLI's two).
    """
    files: dict[str, Path] = {}
    if task.data_dir:
        data_dir = Path(task.data_dir)
        if not data_dir.is_dir():
            raise BertkitError(f"task.data_dir={data_dir}: no such directory")
        for split, name in task.files.items():
            path = data_dir / name
            # A split that a task.*_file replaces need not be in data_dir.
            override_key = SINGLE_FILE_KEYS.get(split.split("_")[0])
            overridden = bool(override_key and task[override_key])
            if path.is_file():
                files[split] = path
            elif not is_test_split(split) and not overridden:
                raise BertkitError(
                    f"task.data_dir={data_dir} has no {name} ({split} split of the original "
                    f"GLUE layout for {task.name}: {', '.join(task.files.values())})"
                )
    for split, key in SINGLE_FILE_KEYS.items():
        if task[key]:
            path = Path(task[key])
            if not path.is_file():
                raise BertkitError(f"task.{key}={path}: file not found")
            prefix = "validation" if split == "validation" else split
            for old in [s for s in files if s.startswith(prefix)]:
                del files[old]
            files[split] = path
    if "train" not in files:
        raise BertkitError(f"task {task.name}: no training file (task.data_dir or task.train_file)")
    if not any(is_validation_split(s) for s in files):
        raise BertkitError(
            f"task {task.name}: no validation file (task.data_dir or task.validation_file)"
        )
    return files


def _fingerprint(task: DictConfig, files: dict[str, Path]) -> str:
    """A content hash of the files and the reading rules, so cached tokenisation is reused
    by every run and sweep job that reads the same data, and never by one that does not."""
    digest = hashlib.sha256()
    reading = {k: task[k] for k in ("columns", "headerless_splits", "headerless_columns",
                                    "labels", "label_range", "skip_malformed_rows")}
    digest.update(json.dumps(OmegaConf.to_container(DictConfig(reading)), sort_keys=True).encode())
    for split, path in sorted(files.items()):
        digest.update(split.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def load_local_splits(task: DictConfig) -> TaskSplits:
    files = local_split_files(task)
    labels = list(task.labels) if task.labels is not None else None
    label_range = list(task.label_range) if task.label_range is not None else None
    columns = OmegaConf.to_container(task.columns)
    headerless = (OmegaConf.to_container(task.headerless_columns)
                  if task.headerless_columns else None)
    splits = {}
    for split, path in files.items():
        base_split = split.split("_")[0]
        table = read_glue_file(
            path,
            columns=columns,
            labels=labels,
            has_header=base_split not in task.headerless_splits,
            headerless_columns=headerless,
            label_range=label_range,
            need_label=not is_test_split(split),
            skip_malformed_rows=task.skip_malformed_rows,
        )
        splits[split] = datasets.Dataset.from_dict(table)
    fingerprint = _fingerprint(task, files)
    return TaskSplits(splits, {split: fingerprint for split in splits})


def load_hub_splits(task: DictConfig) -> TaskSplits:
    hub = task.hub
    raw = load_hub_dataset(
        f"the Hub dataset {hub.path}/{hub.name} for task {task.name}",
        f"give local files: task.data_dir=<dir with {', '.join(task.files.values())}>",
        hub.path, hub.name)
    text_a, text_b = hub.columns.text_a, hub.columns.text_b
    to_task_label = None
    if task.labels is not None:
        to_task_label = [list(task.labels).index(name) for name in hub.labels]
    splits = {}
    for split, table in raw.items():
        columns = {"text_a": table[text_a], "idx": table["idx"]}
        if text_b:
            columns["text_b"] = table[text_b]
        hub_labels = table["label"]
        # GLUE test splits on the Hub carry label -1 (hidden).
        if not all(label == -1 for label in hub_labels):
            columns["label"] = (
                [to_task_label[label] for label in hub_labels] if to_task_label else hub_labels
            )
        splits[split] = datasets.Dataset.from_dict(columns)
    fingerprint = hashlib.sha256(
        "".join(raw[s]._fingerprint for s in sorted(raw)).encode()
    ).hexdigest()[:16]
    return TaskSplits(splits, {split: fingerprint for split in splits})


def load_glue_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    if uses_local_files(task, data_source):
        return load_local_splits(task)
    return load_hub_splits(task)

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
from bertkit.tasks.glue.classes import class_names, file_labels
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
    labels = file_labels(task)
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


def _hub_class_ids(task: DictConfig, raw: datasets.DatasetDict, where: str) -> list[int] | None:
    """Hub class id -> the task's class id, through the class names: the dataset's own
    (a ClassLabel label column, as nyu-mll/glue has), else task.hub.labels. None: regression."""
    names = class_names(task)
    if names is None:
        return None
    feature = next(iter(raw.values())).features.get("label")
    hub_names = getattr(feature, "names", None)
    source = f"the label names of {where}"
    if hub_names is None:
        if task.hub.labels is None:
            raise BertkitError(f"{where} does not name its classes (no ClassLabel label "
                               f"column): set task.hub.labels to the class name of each id")
        hub_names, source = [str(name) for name in task.hub.labels], "task.hub.labels"
    unknown = [name for name in hub_names if name not in names]
    if unknown:
        raise BertkitError(f"{source} {list(hub_names)}: {unknown} not among the task's "
                           f"class names {names} (task.class_names)")
    return [names.index(name) for name in hub_names]


def load_hub_splits(task: DictConfig) -> TaskSplits:
    hub = task.hub
    where = f"the Hub dataset {hub.path}/{hub.name}"
    raw = load_hub_dataset(
        f"{where} for task {task.name}",
        f"give local files: task.data_dir=<dir with {', '.join(task.files.values())}>",
        hub.path, hub.name)
    text_a, text_b = hub.columns.text_a, hub.columns.text_b
    to_task_label = _hub_class_ids(task, raw, where)
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
    # The id mapping too: the cached features hold the mapped labels.
    fingerprint = hashlib.sha256(
        ("".join(raw[s]._fingerprint for s in sorted(raw)) + str(to_task_label)).encode()
    ).hexdigest()[:16]
    return TaskSplits(splits, {split: fingerprint for split in splits})


def load_glue_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    if uses_local_files(task, data_source):
        return load_local_splits(task)
    return load_hub_splits(task)

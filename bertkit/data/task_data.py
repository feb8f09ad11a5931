"""A task's data: where it comes from (local files in the benchmark's original layout, or the
Hub: uses_local_files, the one place this is decided for every family; split_files: which
local file each split reads, for the families whose splits are named once), what a family's
reader hands on (the raw splits of a task with the fingerprint of each), and what the
finetune job carries from data preparation to evaluation.

A dataclass rather than attributes set on `datasets` objects: any `datasets` call that returns
a new object (map, select, concatenate) silently drops such attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
from omegaconf import DictConfig, OmegaConf

from bertkit.data.fingerprints import content_fingerprint
from bertkit.errors import BertkitError

DATA_SOURCES = ("auto", "hub", "local")
# task.<split>_file keys that name one local file for a split.
SINGLE_FILE_KEYS = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def uses_local_files(task: DictConfig, data_source: str) -> bool:
    """data_source=auto: local when task.data_dir or a task.*_file is set, or the task has no
    Hub dataset (task.hub is null). data_source is one of DATA_SOURCES (the schema's
    choices are these: bertkit.config_schema.RunSchema)."""
    # A task family without a test file (SQuAD) has no test_file key: select, not index.
    local = bool(task.data_dir) or any(OmegaConf.select(task, key)
                                       for key in SINGLE_FILE_KEYS.values())
    if data_source == "hub" and task.hub is None:
        raise BertkitError(f"task {task.name} has no Hub dataset (task.hub is null)")
    return data_source == "local" or (data_source == "auto" and (local or task.hub is None))

def split_files(task: DictConfig, required: tuple[str, ...], release: str,
                optional: tuple[str, ...] = ()) -> dict[str, Path]:
    """Split -> an existing file, or one error naming the key and the missing file. An
    optional split (a test set) is read when task.data_dir has its file or it is given."""
    files: dict[str, Path] = {}
    if task.data_dir and not Path(task.data_dir).is_dir():
        raise BertkitError(f"task.data_dir={task.data_dir}: no such directory")
    for split in (*required, *optional):
        single = task[f"{split}_file"]
        if single:
            path, key = Path(single), f"task.{split}_file"
        elif task.data_dir:
            path, key = Path(task.data_dir) / task.files[split], "task.data_dir"
            if split in optional and not path.is_file():
                continue
        elif split in required:
            raise BertkitError(f"task {task.name}: no {split} file (task.data_dir or "
                               f"task.{split}_file)")
        else:
            continue
        if not path.is_file():
            raise BertkitError(f"{key}: {path} not found (the {split} split of {task.name}, "
                               f"{task.files[split]} in {release})")
        files[split] = path
    return files


# The task key that caps the examples of a split, by the split name's first word (MNLI's
# validation_matched and test_mismatched too): run_glue.py's --max_train_samples,
# --max_eval_samples and --max_predict_samples, with its meaning (the first N examples).
SAMPLE_LIMIT_KEYS = {"train": "max_train_samples", "validation": "max_eval_samples",
                     "test": "max_predict_samples"}


@dataclass
class TaskSplits(Mapping):
    """Raw examples per split (read as a mapping split -> table), and per split a fingerprint
    of its content and reading rules (the key of its cache entries) and facts about the source
    (NER: its tag scheme)."""

    tables: dict[str, datasets.Dataset]
    fingerprints: dict[str, str]
    facts: dict[str, dict] = field(default_factory=dict)
    # Splits cut to their first examples (first_examples): {split: {examples, of}}.
    limited: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, split: str) -> datasets.Dataset:
        return self.tables[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def fingerprint(self, *splits: str) -> str:
        """One fingerprint for several splits (all of them when none is named)."""
        return content_fingerprint(*(part for split in (splits or sorted(self.tables))
                                     for part in (split, self.fingerprints[split])))


def sample_limit_key(split: str) -> str:
    """The task key that caps `split` (SAMPLE_LIMIT_KEYS)."""
    prefix = split.split("_")[0]
    if prefix not in SAMPLE_LIMIT_KEYS:
        raise ValueError(f"split {split!r}: not a train, validation or test split, so no "
                         f"task.max_*_samples caps it")
    return SAMPLE_LIMIT_KEYS[prefix]


def first_examples(splits: TaskSplits, limits: Mapping[str, int | None]) -> TaskSplits:
    """The first N examples of each split that limits (task key -> N, or None: all) caps,
    as run_glue.py's dataset.select(range(N)): applied to the raw examples, before any
    tokenisation, so that a smoke run of SST-2 tokenises 64 examples and not 67,349. A cut
    split's fingerprint names N, so that its cache entries are its own and never the full
    split's; a split of N examples or fewer is the full split, and keeps its fingerprint."""
    tables, fingerprints, limited = dict(splits.tables), dict(splits.fingerprints), {}
    for split, table in splits.tables.items():
        limit = limits.get(sample_limit_key(split))
        if limit is None or limit >= len(table):
            continue
        tables[split] = table.select(range(limit))
        fingerprints[split] = content_fingerprint(splits.fingerprints[split], "first", str(limit))
        limited[split] = {"examples": limit, "of": len(table)}
    if not limited:
        return splits
    return replace(splits, tables=tables, fingerprints=fingerprints,
                   limited={**splits.limited, **limited})


@dataclass
class TaskData:
    """A run's data: the raw splits (prediction files, answer decoding), the model's features
    per split, and facts for metrics.json's "data" (counts, tag schemes)."""

    splits: TaskSplits
    features: dict[str, datasets.Dataset]
    facts: dict = field(default_factory=dict)

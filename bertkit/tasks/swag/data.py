"""The SWAG splits of a run (train, validation) from the task config: the release's CSV files
(task.data_dir with task.files, or task.train_file / task.validation_file), or the Hub.

Each split has a fingerprint of its content, so that its encodings are computed once and
shared by every run and sweep job that reads the same data.
"""

from __future__ import annotations

from omegaconf import DictConfig

from bertkit.data.cache import content_fingerprint
from bertkit.data.task_data import TaskSplits, split_files, uses_local_files
from bertkit.tasks.swag.files import read_swag_csv, swag_from_hub

SPLITS = ("train", "validation")
# Bumped when the reader's output for the same bytes changes, so old caches are not reused.
READER_VERSION = "swag-reader-1"


def load_swag_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    """{"train", "validation"} -> examples in the schema of bertkit.tasks.swag.files, with a
    fingerprint of each split's content."""
    if uses_local_files(task, data_source):
        files = split_files(task, SPLITS, "the SWAG release")
        return TaskSplits({split: read_swag_csv(path) for split, path in files.items()},
                          {split: content_fingerprint(READER_VERSION, split, path.read_bytes())
                           for split, path in files.items()})
    hub = task.hub
    files = {split: task.files[split] for split in SPLITS}
    tables = {split: swag_from_hub(hub.path, hub.name, hub.splits[split], files)
              for split in SPLITS}
    return TaskSplits(tables, {split: content_fingerprint(READER_VERSION, split,
                                                          table._fingerprint)
                               for split, table in tables.items()})

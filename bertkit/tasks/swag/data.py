"""The SWAG splits of a run (train, validation) from the task config: the release's CSV files
(task.data_dir with task.files, or task.train_file / task.validation_file), or the Hub.

The DatasetDict carries a fingerprint of the content, so that its encodings are computed
once and shared by every run and sweep job that reads the same data.
"""

from __future__ import annotations

import datasets
from omegaconf import DictConfig

from bertkit.data.fingerprints import content_fingerprint
from bertkit.data.split_files import split_files
from bertkit.tasks.glue.data import uses_local_files
from bertkit.tasks.swag.files import read_swag_csv, swag_from_hub

SPLITS = ("train", "validation")
# Bumped when the reader's output for the same bytes changes, so old caches are not reused.
READER_VERSION = "swag-reader-1"


def load_swag_splits(task: DictConfig, data_source: str = "auto") -> datasets.DatasetDict:
    """{"train", "validation"} -> examples in the schema of bertkit.tasks.swag.files, with a
    `bertkit_fingerprint` attribute."""
    if uses_local_files(task, data_source):
        files = split_files(task, SPLITS, "the SWAG release")
        splits = datasets.DatasetDict({split: read_swag_csv(path)
                                       for split, path in files.items()})
        splits.bertkit_fingerprint = content_fingerprint(
            READER_VERSION,
            *(part for split, path in files.items() for part in (split, path.read_bytes())))
        return splits
    hub = task.hub
    files = {split: task.files[split] for split in SPLITS}
    splits = datasets.DatasetDict({
        split: swag_from_hub(hub.path, hub.name, hub.splits[split], files) for split in SPLITS})
    splits.bertkit_fingerprint = content_fingerprint(
            READER_VERSION,
        *(part for split in SPLITS for part in (split, splits[split]._fingerprint)))
    return splits

"""Where a task's data comes from: local files in the benchmark's original layout, or the Hub.
The one place this is decided, for every family."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

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

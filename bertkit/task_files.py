"""Which local file each split of a task reads: task.data_dir with the release's file names
(task.files), and task.<split>_file on top. Shared by the families whose splits are fixed
(SQuAD, SWAG); GLUE's layout, with its optional and multiple splits, is glue_data's."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from bertkit.errors import BertkitError


def required_split_files(task: DictConfig, splits: tuple[str, ...],
                         release: str) -> dict[str, Path]:
    """Split -> an existing file, or one error naming the key and the missing file."""
    files: dict[str, Path] = {}
    for split in splits:
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
                               f"{task.files[split]} in {release})")
        files[split] = path
    return files

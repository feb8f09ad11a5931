"""Which local file each split of a task reads: task.data_dir with the release's file names
(task.files), and task.<split>_file on top. Shared by the families whose splits are named once
(SQuAD, SWAG, NER); GLUE's layout, with MNLI's pairs of splits, is glue_data's."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from bertkit.errors import BertkitError


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

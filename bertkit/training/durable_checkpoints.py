"""A checkpoint counts as saved once its files are on the disk, not in the page cache.

Trainer writes a checkpoint's files without fsync; after a node crash, or on NFS and Lustre,
some may never reach the disk, or reach it cut short, whatever their order. Once Trainer has
saved (on_save), each process fsyncs the checkpoint's files and the folders that name them
(the checkpoint's own and the one holding it), so a checkpoint that a resume finds is whole
unless the machine died during this very save; bertkit.training.checkpoint_files judges the
rest by content. One fsync per file, after a save that wrote them anyway: the cost is the
time the disk takes to hold what Trainer wrote. fsync_checkpoints=false turns it off
(conf/config.yaml).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder's entries: the names of the files in it)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    except OSError as err:  # some filesystems refuse fsync on a folder (EINVAL)
        logger.debug("fsync %s: %s", path, err)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> int:
    """fsync every file under `folder`, then each folder (deepest first) and `folder`'s
    parent; returns how many files."""
    files = 0
    for root, _, names in os.walk(folder, topdown=False):
        for name in names:
            fsync_path(Path(root) / name)
            files += 1
        fsync_path(Path(root))
    fsync_path(folder.parent)
    return files


class DurableCheckpoints(TrainerCallback):
    """fsyncs each checkpoint as soon as Trainer has written it."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            logger.debug("fsynced %d files of %s", fsync_tree(folder), folder)
        return control

"""The checkpoint a run resumes from: the newest whole one.

A job killed while Trainer writes a checkpoint (preemption during a save is ordinary on a
cluster: BERT-large's weights and optimizer state take seconds to write) leaves a folder with
some of its files, the last one cut short; after a node crash, or on NFS and Lustre, any of
them may be cut, whatever order they were written in. transformers' get_last_checkpoint takes
the newest folder whatever it holds, and resuming from a torn one ends in a safetensors or
FileNotFoundError traceback although a whole checkpoint lies beside it. So each checkpoint is
judged by the content of the files the resume reads (bertkit.training.checkpoint_files), and
bertkit fsyncs a checkpoint's files once Trainer has saved them
(bertkit.training.durable_checkpoints).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from bertkit.training.checkpoint_files import checkpoint_fault

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


@dataclass
class CheckpointScan:
    """The newest complete checkpoint (None: none is), and each newer one skipped with why."""

    complete: Path | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def describe_skipped(self) -> str:
        return "; ".join(f"{folder.name}: {why}" for folder, why in self.skipped)


def checkpoint_step(folder: Path) -> int | None:
    match = _CHECKPOINT.match(folder.name)
    return int(match.group(1)) if match else None


def scan_checkpoints(output_dir: str | Path, *, weights_only: bool = False) -> CheckpointScan:
    """Checkpoints from the newest step down to the first whole one (weights_only: the run
    saves with trainer.save_only_model, without optimizer, scheduler and RNG states)."""
    directory = Path(output_dir)
    folders = [path for path in directory.iterdir()
               if checkpoint_step(path) is not None and path.is_dir()] \
        if directory.is_dir() else []
    scan = CheckpointScan(None)
    for folder in sorted(folders, key=checkpoint_step, reverse=True):
        why = checkpoint_fault(folder, weights_only=weights_only)
        if why is None:
            scan.complete = folder
            break
        scan.skipped.append((folder, why))
    return scan

"""The checkpoint a run resumes from: the newest complete one.

A job killed while Trainer writes a checkpoint (preemption during a save is ordinary on a
cluster: BERT-large's weights and optimizer state take seconds to write) leaves a folder with
some of its files, the last one cut short. transformers' get_last_checkpoint takes the newest
folder whatever it holds, and resuming from a torn one ends in a safetensors or
FileNotFoundError traceback although a complete checkpoint lies beside it.

Trainer writes a checkpoint's files in a fixed order (weights, optimizer, scheduler, RNG
states) and trainer_state.json last, so a checkpoint whose trainer_state.json reads back as
JSON holds everything before it. (A kill cannot reorder writes; only a machine crash before
the page cache is flushed could, which no ordering rule survives.)
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME: written last
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


def incompleteness(folder: Path) -> str | None:
    """Why `folder` cannot be resumed from (a save cut short), or None when it is complete."""
    state = folder / STATE_FILE
    if not state.is_file():
        return f"no {STATE_FILE} (Trainer writes it last: the save was cut short)"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return f"{STATE_FILE} is cut short (not valid JSON)"
    return None


def scan_checkpoints(output_dir: str | Path) -> CheckpointScan:
    """Checkpoints from the newest step down to the first complete one."""
    directory = Path(output_dir)
    folders = [path for path in directory.iterdir()
               if checkpoint_step(path) is not None and path.is_dir()] \
        if directory.is_dir() else []
    scan = CheckpointScan(None)
    for folder in sorted(folders, key=checkpoint_step, reverse=True):
        why = incompleteness(folder)
        if why is None:
            scan.complete = folder
            break
        scan.skipped.append((folder, why))
    return scan

"""Whether a checkpoint's files are whole, judged by their content, cheaply.

On cluster filesystems (NFS, Lustre) and after a node crash, files written without fsync do
not reach the disk in the order they were written: a checkpoint can hold a whole
trainer_state.json beside half a model.safetensors. So no single file vouches for the
others; each file a resume reads is checked itself, without loading tensors:

    *.safetensors   the header's length, its JSON, and the tensors' last byte against the
                    file's size
    *.pt *.pth *.bin torch.save's zip: the central directory at the end, and every entry
                    inside the part of the file before it (a file cut anywhere loses either)
    *.json          parses

and the files Trainer's resume needs must be there (it silently starts a fresh optimizer
when optimizer.pt is missing, for instance).
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from transformers.trainer import (
    FSDP_MODEL_NAME,
    OPTIMIZER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from bertkit.data.readback import DamagedFile, read_json

STATE_FILE = TRAINER_STATE_NAME
# The weights Trainer saves (whole, or sharded with an index; PEFT's adapter files); FSDP's
# sharded state dict is a folder (pytorch_model_fsdp_0/).
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME,
                 ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
WEIGHTS_FOLDERS = (FSDP_MODEL_NAME,)
OPTIMIZER_FILE, SCHEDULER_FILE = OPTIMIZER_NAME, SCHEDULER_NAME
# FSDP's sharded optimizer (optimizer_0/) and DeepSpeed's state (global_step<N>/) are folders.
OPTIMIZER_FOLDERS = ("optimizer_", "global_step")
RNG_PATTERN = "rng_state*.pth"  # rng_state.pth, or rng_state_<rank>.pth under DDP
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def safetensors_fault(path: Path) -> str | None:
    """Why a safetensors file is not whole: its 8-byte header length, the JSON header, and
    the end of its last tensor against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"cut short ({size} bytes, not even the header's length)"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return f"cut short ({size} bytes; the header alone needs {8 + length})"
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError):
            return "its header is not valid JSON"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"cut short ({size} bytes; its header describes {expected})"
    return None


def torch_file_fault(path: Path) -> str | None:
    """Why a torch.save file is not whole: a zip archive whose central directory (the last
    bytes written) reads back and whose entries all lie before it."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            directory_start = archive.start_dir
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return f"cut short (not a whole torch.save archive; {path.stat().st_size} bytes)"
    for entry in entries:
        if entry.header_offset + entry.compress_size > directory_start:
            return f"cut short (entry {entry.filename} runs past the archive's directory)"
    return None


def json_fault(path: Path) -> str | None:
    try:
        read_json(path, expect=object)
    except DamagedFile:
        return "cut short (not valid JSON)"
    return None


def file_fault(path: Path) -> str | None:
    """Why one checkpoint file is not whole, by its kind; None when whole or of a kind not
    checked (a tokenizer's vocab.txt)."""
    if path.name.endswith(".safetensors"):
        return safetensors_fault(path)
    if path.name.endswith(TORCH_SUFFIXES):
        return torch_file_fault(path)
    if path.name.endswith(".json"):
        return json_fault(path)
    return None


def missing_files(folder: Path, *, weights_only: bool = False) -> list[str]:
    """The files Trainer's resume reads that `folder` lacks (weights_only: a checkpoint saved
    with trainer.save_only_model holds no optimizer, scheduler or RNG state)."""
    names = {path.name for path in folder.iterdir()}
    has_folder = lambda prefixes: any(  # noqa: E731 - one line, used twice
        name.startswith(prefixes) and (folder / name).is_dir() for name in names)
    missing = [] if STATE_FILE in names else [STATE_FILE]
    if not names.intersection(WEIGHTS_FILES) and not has_folder(WEIGHTS_FOLDERS):
        missing.append(f"weights ({SAFE_WEIGHTS_NAME})")
    if weights_only:
        return missing
    if OPTIMIZER_FILE not in names and not has_folder(OPTIMIZER_FOLDERS):
        missing.append(OPTIMIZER_FILE)
    if SCHEDULER_FILE not in names:
        missing.append(SCHEDULER_FILE)
    if not any(folder.glob(RNG_PATTERN)):
        missing.append("rng_state.pth (nor any rng_state_<rank>.pth)")
    return missing


def index_shards(folder: Path) -> list[str]:
    """The shard files a sharded weights index names."""
    shards = set()
    for index in folder.glob("*.index.json"):
        try:
            shards.update(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            continue  # the index's own fault is told by file_fault
    return sorted(shards)


def checkpoint_fault(folder: Path, *, weights_only: bool = False) -> str | None:
    """Why `folder` cannot be resumed from, naming the file; None when every file it holds
    is whole and none that the resume reads is missing."""
    missing = missing_files(folder, weights_only=weights_only)
    missing += [shard for shard in index_shards(folder) if not (folder / shard).is_file()]
    if missing:
        return f"no {', no '.join(missing)} (the save was cut short)"
    for path in sorted(folder.iterdir()):
        if path.is_file():
            why = file_fault(path)
            if why is not None:
                return f"{path.name} is {why}"
    return None

"""Fingerprints by content, never by path: they key the on-disk caches of tokenised data (file
bytes, reading rules, tokenizer), so every run and sweep job that reads the same data with the
same tokenizer reuses one cache and no other run does; and they are a run's identity in
bertkit-report (its local checkpoint, tokenizer and corpus), so that the same files under
two paths are one configuration and other files under one path are not."""

from __future__ import annotations

import hashlib
import json
import os
import string
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from bertkit.data.atomic_files import write_text_atomic


def content_fingerprint(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """The vocabulary and rules, without the truncation and padding settings that every call
    leaves in the backend tokenizer (with them, a second encoding in one process missed)."""
    if not tokenizer.is_fast:
        return hashlib.sha256(repr(tokenizer).encode()).hexdigest()[:16]
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


# A run's inputs named by a local path are compared by content in bertkit-report (its run
# identity, bertkit.reporting.identity): metrics.json's details.input_fingerprints maps each
# such config key to the fingerprint of what the run read there. A Hub id is left out (the id
# names the content). The task's data files have their own: details.data_fingerprint.
# What a checkpoint directory holds that changes the model it loads: the config and the
# weights (sharded or not, with their index), in any of transformers' formats; not its
# tokenizer files (model.tokenizer's own fingerprint), model card or training_args.bin.
CHECKPOINT_FILES = ("config.json", "model*.safetensors", "model*.safetensors.index.json",
                    "pytorch_model*.bin", "pytorch_model*.bin.index.json", "tf_model.h5",
                    "flax_model.msgpack")
DIGESTS = "file_digests"  # <cache_dir>/file_digests/: each hashed file's sha256, by its stat


def file_digest(path: Path, cache_dir: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, remembered in the cache under its path, size, mtime and
    inode: a checkpoint or corpus of many GB is read once, not by every run and sweep job
    that starts from it, and a file rewritten in place is read again."""
    stat = path.stat()
    memo = Path(cache_dir) / DIGESTS / content_fingerprint(
        str(path.resolve()), str(stat.st_size), str(stat.st_mtime_ns), str(stat.st_ino))
    try:
        remembered = memo.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        remembered = ""
    if len(remembered) == 64 and all(c in string.hexdigits for c in remembered):
        return remembered
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    try:
        write_text_atomic(memo, digest)
    except OSError:  # a read-only cache: the digest is still right, only not remembered
        pass
    return digest


def files_content_fingerprint(files: Sequence[Path], cache_dir: str | os.PathLike) -> str:
    """The files' contents in their order, whatever their names."""
    return content_fingerprint(*(file_digest(path, cache_dir) for path in files))


def checkpoint_fingerprint(directory: Path, cache_dir: str | os.PathLike) -> str:
    """A local checkpoint's config and weights (CHECKPOINT_FILES), each by name and content."""
    files = sorted({file for pattern in CHECKPOINT_FILES for file in directory.glob(pattern)
                    if file.is_file()})
    return content_fingerprint(*(part for file in files
                                 for part in (file.name, file_digest(file, cache_dir))))


def tokenizer_content(tokenizer: PreTrainedTokenizerBase) -> str:
    """The vocabulary and rules a tokenizer was loaded with, whatever directory held them: a
    fast tokenizer's state (tokenizer_fingerprint), a slow one's vocabulary and settings
    (its repr names its directory)."""
    if tokenizer.is_fast:
        return tokenizer_fingerprint(tokenizer)
    settings = {key: value for key, value in tokenizer.init_kwargs.items()
                if key != "name_or_path" and not key.endswith("_file")}
    return content_fingerprint(type(tokenizer).__name__,
                               json.dumps(tokenizer.get_vocab(), sort_keys=True),
                               json.dumps(settings, sort_keys=True, default=str))


def local_directory(name: object) -> Path | None:
    """The directory a model key names, or None for a Hub id (or nothing)."""
    if not name:
        return None
    path = Path(str(name)).expanduser()
    return path if path.is_dir() else None


def model_input_fingerprints(model: DictConfig, tokenizer: PreTrainedTokenizerBase | None,
                             cache_dir: str | os.PathLike) -> dict[str, str]:
    """details.input_fingerprints of the model node's local inputs: the checkpoint the run
    started from (model.started_from of a two-stage run's target: its own checkpoint is the
    first stage's, one per seed) and the tokenizer it loaded."""
    found = {}
    start = local_directory(OmegaConf.select(model, "started_from")
                            or OmegaConf.select(model, "name_or_path"))
    if start is not None:
        found["model.name_or_path"] = checkpoint_fingerprint(start, cache_dir)
    if tokenizer is not None and local_directory(OmegaConf.select(model, "tokenizer")):
        found["model.tokenizer"] = tokenizer_content(tokenizer)
    return found

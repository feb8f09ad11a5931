"""The one on-disk cache of tokenised and featurised data, shared by every run and sweep job,
and its keys: fingerprints by content (the last section), which are also a run's identity.

An entry is <cache_dir>/<kind>/<key>/, keyed by what determines its content and nothing else:
the data's fingerprint (file bytes and reading rules, bertkit.data.task_data), the tokenizer's,
and the family's settings (max length, stride, ...). Never by path or run, so that two jobs
that read the same data with the same tokenizer share one entry, and no other job does.

Two ways to fill an entry: `cached_map` (datasets.map with a fixed cache file) and
`cached_build` (features built in Python with facts beside them, NER's counts). Hydra's
parallel launchers (joblib, submitit) start sweep jobs at the same moment in separate
processes, so each item is built under an inter-process file lock beside it: the first job
builds it, the others wait and read its result. Items are still written to a temporary file
or directory and renamed, so a crashed job leaves no half item behind; and an item is checked
(bertkit.data.atomic_files) before it is read, so one cut anyway (a full disk, a partial copy) is
rebuilt instead of read as data.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import string
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import datasets
from filelock import FileLock
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from bertkit.data.atomic_files import (
    check_arrow,
    check_saved_dataset,
    discard_damaged,
    read_json,
    telling_failed_writes,
    write_text_atomic,
)

logger = logging.getLogger(__name__)

# datasets.map writes its file as tempfile's tmpXXXXXXXX beside it, and leaves it behind when
# the disk is full (its cleanup writes again and fails first): a refused write removes it.
_MAP_TEMPORARY = "tmp????????"
_FREE = ("nothing half written was kept: free some space, or set cache_dir (BERTKIT_CACHE) to "
         "a disk that has it")


def cache_entry(cache_dir: str | os.PathLike, kind: str, *, data: str,
                tokenizer: PreTrainedTokenizerBase | None, settings: dict) -> Path:
    """The entry's directory (created): <cache_dir>/<kind>/<key>."""
    key = content_fingerprint(
        data, tokenizer_fingerprint(tokenizer) if tokenizer is not None else "",
        json.dumps(settings, sort_keys=True, default=str))
    entry = Path(cache_dir) / kind / key
    entry.mkdir(parents=True, exist_ok=True)
    return entry


def _lock(entry: Path, name: str) -> FileLock:
    """Held while an item is built or read: one job builds it, the others wait for it."""
    return FileLock(entry / f".{name}.lock")


def _log(built: bool, entry: Path, name: str) -> None:
    if built:
        logger.info("tokenised %s into %s", name, entry)
    else:
        logger.info("read %s from the cache %s", name, entry)


def _map_files(entry: Path, name: str) -> dict[str, tuple[int, int]]:
    """The item's files (<name>.arrow, or one per shard with num_proc > 1): a file datasets
    (re)wrote has a new inode and mtime."""
    files = [entry / f"{name}.arrow", *entry.glob(f"{name}_?????_of_?????.arrow")]
    return {file.name: (file.stat().st_ino, file.stat().st_mtime_ns)
            for file in files if file.is_file()}


def cached_map(table: datasets.Dataset, function: Callable, entry: Path, name: str,
               num_proc: int = 1, **map_kwargs) -> datasets.Dataset:
    """table.map(function, batched=True, ...) cached as <entry>/<name>.arrow.

    datasets.map itself loads the file when it exists (unless load_from_cache_file=False),
    and writes a temporary file and renames it otherwise; whether it built is read from
    the item's files changing."""
    with _lock(entry, name):
        files = [entry / file for file in _map_files(entry, name)]

        def check() -> None:
            for file in files:
                check_arrow(file)

        discard_damaged(files, check, f"tokenised {name}")
        before = _map_files(entry, name)
        temporary = set(entry.glob(_MAP_TEMPORARY))
        with telling_failed_writes(
                f"the cache entry of tokenised {name}", entry / f"{name}.arrow", then=_FREE,
                leftovers=lambda: set(entry.glob(_MAP_TEMPORARY)) - temporary):
            result = table.map(function, batched=True,
                               num_proc=num_proc if num_proc > 1 else None,
                               cache_file_name=str(entry / f"{name}.arrow"), **map_kwargs)
        _log(_map_files(entry, name) != before, entry, name)
    return result


def cached_build(entry: Path, name: str,
                 build: Callable[[], tuple[datasets.Dataset, dict]]
                 ) -> tuple[datasets.Dataset, dict]:
    """(table, facts) saved under <entry>/<name>/, built once; loaded memory-mapped after."""
    directory = entry / name
    facts_file = directory / "facts.json"
    with _lock(entry, name):
        if directory.exists():
            discard_damaged([directory], lambda: (read_json(facts_file),
                                                  check_saved_dataset(directory / "table")),
                            f"cached {name}")
        built = not facts_file.is_file()
        if built:
            table, facts = build()
            tmp = Path(tempfile.mkdtemp(dir=entry, prefix=f".{name}."))
            try:
                with telling_failed_writes(f"the cache entry of {name}", directory, then=_FREE):
                    table.save_to_disk(str(tmp / "table"))
                    (tmp / "facts.json").write_text(json.dumps(facts))
                    os.replace(tmp, directory)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp)
        _log(built, entry, name)
        return datasets.load_from_disk(str(directory / "table")), read_json(facts_file)


# ================================================================================================
# Fingerprints by content, never by path: they key the on-disk caches of tokenised data (file
# bytes, reading rules, tokenizer), so every run and sweep job that reads the same data with the
# same tokenizer reuses one cache and no other run does; and they are a run's identity in
# bertkit-report (its local checkpoint, tokenizer and corpus), so that the same files under
# two paths are one configuration and other files under one path are not.

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

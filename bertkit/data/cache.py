"""The one on-disk cache of tokenised and featurised data, shared by every run and sweep job.

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

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets
from filelock import FileLock
from transformers import PreTrainedTokenizerBase

from bertkit.data.atomic_files import (
    check_arrow,
    check_saved_dataset,
    discard_damaged,
    read_json,
    telling_failed_writes,
)
from bertkit.data.fingerprints import content_fingerprint, tokenizer_fingerprint

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

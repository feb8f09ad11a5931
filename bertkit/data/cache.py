"""The one on-disk cache of tokenised and featurised data, shared by every run and sweep job.

An entry is <cache_dir>/<kind>/<key>/, keyed by what determines its content and nothing else:
the data's fingerprint (file bytes and reading rules, bertkit.data.task_data), the tokenizer's,
and the family's settings (max length, stride, ...). Never by path or run, so that two jobs
that read the same data with the same tokenizer share one entry, and no other job does.

Two ways to fill an entry: `cached_map` (datasets.map with a fixed cache file; datasets writes
it to a temporary file and renames it, so a reader never sees half of it), and `cached_build`
for features built in Python with facts beside them (NER's counts), saved with save_to_disk
to a temporary directory and renamed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.data.fingerprints import content_fingerprint, tokenizer_fingerprint


def cache_entry(cache_dir: str | os.PathLike, kind: str, *, data: str,
                tokenizer: PreTrainedTokenizerBase | None, settings: dict) -> Path:
    """The entry's directory (created): <cache_dir>/<kind>/<key>."""
    key = content_fingerprint(
        data, tokenizer_fingerprint(tokenizer) if tokenizer is not None else "",
        json.dumps(settings, sort_keys=True, default=str))
    entry = Path(cache_dir) / kind / key
    entry.mkdir(parents=True, exist_ok=True)
    return entry


def cached_map(table: datasets.Dataset, function: Callable, entry: Path, name: str,
               num_proc: int = 1, **map_kwargs) -> datasets.Dataset:
    """table.map(function, batched=True, ...) cached as <entry>/<name>.arrow."""
    return table.map(function, batched=True, num_proc=num_proc if num_proc > 1 else None,
                     cache_file_name=str(entry / f"{name}.arrow"), **map_kwargs)


def cached_build(entry: Path, name: str,
                 build: Callable[[], tuple[datasets.Dataset, dict]]
                 ) -> tuple[datasets.Dataset, dict]:
    """(table, facts) saved under <entry>/<name>/, built once; loaded memory-mapped after."""
    directory = entry / name
    facts_file = directory / "facts.json"
    if not facts_file.is_file():
        table, facts = build()
        tmp = Path(tempfile.mkdtemp(dir=entry, prefix=f".{name}."))
        try:
            table.save_to_disk(str(tmp / "table"))
            (tmp / "facts.json").write_text(json.dumps(facts))
            try:
                os.replace(tmp, directory)
            except OSError:  # another process got there first: its copy is the same
                if not facts_file.is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return (datasets.load_from_disk(str(directory / "table")),
            json.loads(facts_file.read_text()))

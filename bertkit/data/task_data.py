"""What a family's reader hands on: the raw splits of a task with the fingerprint of each, and
what the finetune template carries from data preparation to evaluation.

A dataclass rather than attributes set on `datasets` objects: any `datasets` call that returns
a new object (map, select, concatenate) silently drops such attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import datasets

from bertkit.data.fingerprints import content_fingerprint


@dataclass
class TaskSplits(Mapping):
    """Raw examples per split (read as a mapping split -> table), and per split a fingerprint
    of its content and reading rules (the key of its cache entries) and facts about the source
    (NER: its tag scheme)."""

    tables: dict[str, datasets.Dataset]
    fingerprints: dict[str, str]
    facts: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, split: str) -> datasets.Dataset:
        return self.tables[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def fingerprint(self, *splits: str) -> str:
        """One fingerprint for several splits (all of them when none is named)."""
        return content_fingerprint(*(part for split in (splits or sorted(self.tables))
                                     for part in (split, self.fingerprints[split])))


@dataclass
class TaskData:
    """A run's data: the raw splits (prediction files, answer decoding), the model's features
    per split, and facts for metrics.json's "data" (counts, tag schemes)."""

    splits: TaskSplits
    features: dict[str, datasets.Dataset]
    facts: dict = field(default_factory=dict)

"""What a family's reader hands on: the raw splits of a task with the fingerprint of each, and
what the finetuning template carries from data preparation to evaluation.

A dataclass rather than attributes set on `datasets` objects: any `datasets` call that returns
a new object (map, select, concatenate) silently drops such attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets


@dataclass
class TaskSplits:
    """Raw examples per split, and per split a fingerprint of its content and reading rules
    (the key of its cache entries) and facts about the source (NER: its tag scheme)."""

    tables: dict[str, datasets.Dataset]
    fingerprints: dict[str, str]
    facts: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, split: str) -> datasets.Dataset:
        return self.tables[split]

    def __contains__(self, split: str) -> bool:
        return split in self.tables

    def __iter__(self):
        return iter(self.tables)

    def items(self):
        return self.tables.items()

    def values(self):
        return self.tables.values()

    def fingerprint(self, *splits: str) -> str:
        """One fingerprint for several splits (all of them when none is named)."""
        from bertkit.data.fingerprints import content_fingerprint

        return content_fingerprint(*(part for split in (splits or sorted(self.tables))
                                     for part in (split, self.fingerprints[split])))


@dataclass
class TaskData:
    """A run's data: the raw splits (prediction files, answer decoding), the model's features
    per split, and facts for metrics.json's "data" (counts, tag schemes)."""

    splits: TaskSplits
    features: dict[str, datasets.Dataset]
    facts: dict = field(default_factory=dict)

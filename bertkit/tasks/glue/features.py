"""Tokenise GLUE splits once per (data, tokenizer, max length), cached for every run.

No padding here: the collator pads each batch to its longest sequence (dynamic padding).
"""

from __future__ import annotations

from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.data.cache import cache_entry, cached_map
from bertkit.data.task_data import TaskSplits


def tokenize_splits(
    splits: TaskSplits,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    cache_dir: str | Path,
    num_proc: int = 1,
) -> dict[str, datasets.Dataset]:
    """Adds input_ids, token_type_ids, attention_mask and `length` (for length grouping)."""
    pair = "text_b" in splits[next(iter(splits))].column_names

    def encode(batch: dict) -> dict:
        encoded = tokenizer(
            batch["text_a"],
            batch["text_b"] if pair else None,
            truncation=True,
            max_length=max_seq_length,
        )
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    entry = cache_entry(cache_dir, "glue", data=splits.fingerprint(), tokenizer=tokenizer,
                        settings={"max_seq_length": max_seq_length})
    return {split: cached_map(table, encode, entry, split, num_proc=num_proc,
                              desc=f"Tokenizing {split}")
            for split, table in splits.items()}

"""Tokenise GLUE splits once per (data, tokenizer, max length), cached on disk for every run.

No padding here: the collator pads each batch to its longest sequence (dynamic padding).
"""

from __future__ import annotations

from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.data.fingerprints import tokenizer_fingerprint


def tokenize_splits(
    splits: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    cache_dir: str | Path,
    num_proc: int = 1,
) -> datasets.DatasetDict:
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

    key = f"{splits.bertkit_fingerprint}-{tokenizer_fingerprint(tokenizer)}-{max_seq_length}"
    cache = Path(cache_dir) / "tokenized" / key
    cache.mkdir(parents=True, exist_ok=True)
    return splits.map(
        encode,
        batched=True,
        num_proc=num_proc if num_proc > 1 else None,
        cache_file_names={split: str(cache / f"{split}.arrow") for split in splits},
        desc="Tokenizing",
    )

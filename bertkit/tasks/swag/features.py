"""SWAG examples -> four encodings each, `[CLS] sent1 [SEP] sent2 + " " + ending [SEP]`, as in
the paper (section 4.4) and Hugging Face's run_swag.py, cached on disk once per (data,
tokenizer, max length) for every run.

Only the second segment is truncated: the context is shared by the four choices, so cutting
it would compare them on different contexts. No padding here: the collator pads the four
choices of every example in a batch together; `length` (the longest of the four) lets
BertkitTrainer group batches.
"""

from __future__ import annotations

from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.data.cache import cache_entry, cached_map
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.swag.files import ENDINGS, NUM_CHOICES

MODEL_COLUMNS = ("input_ids", "token_type_ids", "attention_mask")
_CHOICES = datasets.List(datasets.List(datasets.Value("int64")))
FEATURES = datasets.Features({
    "idx": datasets.Value("int64"),
    "label": datasets.Value("int64"),
    **{column: _CHOICES for column in MODEL_COLUMNS},
    "length": datasets.Value("int64"),
})


def check_max_seq_length(max_seq_length) -> None:
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) \
            or max_seq_length < 4:
        raise BertkitError(f"task.max_seq_length={max_seq_length!r}: expected an integer of at "
                           f"least 4 ([CLS], [SEP], [SEP] and one token)")


def second_segments(sent2: str, endings: list[str]) -> list[str]:
    """sent2 + " " + ending for each choice (sent2 may be empty: then the ending alone)."""
    return [f"{sent2} {ending}" if sent2.strip() else ending for ending in endings]


def encode_batch(batch: dict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                 split: str = "") -> dict:
    """A batch of examples -> per example, lists of NUM_CHOICES token lists, and `length`."""
    n = len(batch["sent1"])
    first = [context for context in batch["sent1"] for _ in range(NUM_CHOICES)]
    second = [segment for i in range(n) for segment in
              second_segments(batch["sent2"][i], [batch[e][i] for e in ENDINGS])]
    try:
        encoded = tokenizer(first, second, truncation="only_second",
                            max_length=max_seq_length)
    except Exception:  # the tokenizer cannot cut the second segment enough: name the example
        counts = tokenizer(list(batch["sent1"]), add_special_tokens=False)["input_ids"]
        for i, ids in enumerate(counts):
            if len(ids) + 3 >= max_seq_length:
                raise BertkitError(
                    f"task.max_seq_length={max_seq_length}: example {batch['idx'][i]} of the "
                    f"{split or 'data'} split has {len(ids)} tokens in sent1 alone, which "
                    f"leaves no room for an ending ([CLS] sent1 [SEP] sent2 ending [SEP]; only "
                    f"the second segment is truncated); raise task.max_seq_length") from None
        raise
    out = {column: [encoded[column][i * NUM_CHOICES:(i + 1) * NUM_CHOICES] for i in range(n)]
           for column in MODEL_COLUMNS}
    out["length"] = [max(len(ids) for ids in choices) for choices in out["input_ids"]]
    return out


def encode_splits(
    splits: TaskSplits,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    cache_dir: str | Path,
    num_proc: int = 1,
) -> dict[str, datasets.Dataset]:
    """Columns idx, label, input_ids / token_type_ids / attention_mask ([example][choice]
    [token]) and length; cached by data, tokenizer and max length (bertkit.data.cache)."""
    check_max_seq_length(max_seq_length)
    entry = cache_entry(cache_dir, "swag", data=splits.fingerprint(), tokenizer=tokenizer,
                        settings={"max_seq_length": max_seq_length})
    return {split: cached_map(
                table, encode_batch, entry, split, num_proc=num_proc,
                fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length,
                           "split": split},
                remove_columns=[c for c in table.column_names if c not in ("idx", "label")],
                features=FEATURES, desc=f"Encoding the {split} choices")
            for split, table in splits.items()}

"""Pretraining data as datasets: documents -> token ids per sentence -> NSP pair instances.

Both steps run through datasets.map (batched, several processes, cached by fingerprint).
Each document's instances come from a generator seeded by (seed, copy, document index), so
they do not depend on the process count or batch size.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.nsp_instances import model_inputs, pair_instances_from_document


def documents_dataset(documents: Iterable[list[str]]) -> datasets.Dataset:
    """In memory for now; a corpus larger than memory needs the streaming path (not built)."""
    return datasets.Dataset.from_dict({"sentences": list(documents)})


def tokenize_documents(documents: datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
                       num_proc: int | None = None) -> datasets.Dataset:
    """Column sentence_ids: one list of WordPiece ids per sentence; empty sentences dropped."""

    def encode(batch: dict) -> dict:
        flat = [sentence for document in batch["sentences"] for sentence in document]
        ids = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
        out, start = [], 0
        for document in batch["sentences"]:
            out.append([s for s in ids[start:start + len(document)] if s])
            start += len(document)
        return {"sentence_ids": out}

    tokenized = documents.map(encode, batched=True, num_proc=num_proc,
                              remove_columns=documents.column_names, desc="Tokenizing documents")
    return tokenized.filter(lambda row: len(row["sentence_ids"]) > 0, num_proc=num_proc)


class _DocumentView(Sequence):
    """Random access to tokenised documents without loading the corpus into memory."""

    def __init__(self, tokenized: datasets.Dataset):
        self.tokenized = tokenized

    def __len__(self) -> int:
        return len(self.tokenized)

    def __getitem__(self, index):
        return self.tokenized[index]["sentence_ids"]


def pair_instances_dataset(tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                           max_seq_length: int, short_seq_prob: float, seed: int,
                           copies: int = 1, num_proc: int | None = None) -> datasets.Dataset:
    """input_ids, token_type_ids, next_sentence_label and length, `copies` times over."""
    view = _DocumentView(tokenized)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict, indices: list[int], copy: int) -> dict:
        out = {"input_ids": [], "token_type_ids": [], "next_sentence_label": [], "length": []}
        for index in indices:
            rng = random.Random(f"{seed}-{copy}-{index}")
            for instance in pair_instances_from_document(
                    view, index, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                    rng=rng):
                row = model_inputs(instance, cls_id, sep_id)
                for key, value in row.items():
                    out[key].append(value)
                out["length"].append(len(row["input_ids"]))
        return out

    parts = [tokenized.map(build, batched=True, with_indices=True, fn_kwargs={"copy": copy},
                           remove_columns=tokenized.column_names, num_proc=num_proc,
                           desc=f"NSP instances, copy {copy + 1}")
             for copy in range(copies)]
    return datasets.concatenate_datasets(parts)

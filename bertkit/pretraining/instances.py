"""Pretraining data as datasets: documents -> token ids per sentence -> NSP or SOP pair
instances, or full-sentence packed sequences for MLM alone.

Both steps run through datasets.map (batched, several processes, cached by fingerprint).
Each document's pair instances come from a generator seeded by (seed, copy, document index),
so they do not depend on the process count or batch size.

A corpus larger than memory is read as a datasets.IterableDataset (streaming=True); there is
no random access to other documents, so streaming_instances draws NotNext segments from the
other documents of a buffer of consecutive documents.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import datasets
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from bertkit.pretraining.full_sentences import pack_full_sentences
from bertkit.pretraining.objective import objective_named
from bertkit.pretraining.sentence_pairs import (
    check_sentence_task,
    model_inputs,
    pair_instances_from_document,
)

PAIR_COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label", "length")
PACKED_COLUMNS = ("input_ids", "token_type_ids", "length")


def documents_dataset(documents: Iterable[list[str]]) -> datasets.Dataset:
    """In memory; a corpus larger than memory goes through streaming_instances instead."""
    return datasets.Dataset.from_dict({"sentences": list(documents)})


def tokenize_documents(documents: datasets.Dataset | datasets.IterableDataset,
                       tokenizer: PreTrainedTokenizerBase,
                       num_proc: int | None = None) -> datasets.Dataset | datasets.IterableDataset:
    """Column sentence_ids: one list of WordPiece ids per sentence; empty sentences dropped.

    An IterableDataset stays lazy: it is tokenised as it is read, in the reading process
    (num_proc does not apply)."""

    def encode(batch: dict) -> dict:
        flat = [sentence for document in batch["sentences"] for sentence in document]
        ids = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
        out, start = [], 0
        for document in batch["sentences"]:
            out.append([s for s in ids[start:start + len(document)] if s])
            start += len(document)
        return {"sentence_ids": out}

    if isinstance(documents, datasets.IterableDataset):
        # Its features may be unknown (column_names None), so keep the one column we read.
        tokenized = documents.select_columns(["sentences"]).map(
            encode, batched=True, remove_columns=["sentences"])
        return tokenized.filter(_has_sentences)
    tokenized = documents.map(encode, batched=True, num_proc=num_proc,
                              remove_columns=documents.column_names, desc="Tokenizing documents")
    return tokenized.filter(_has_sentences, num_proc=num_proc)


def _has_sentences(row: dict) -> bool:
    return len(row["sentence_ids"]) > 0


class _ArrowDocument(Sequence):
    """One tokenised document left in Arrow: a NotNext segment reads the few sentences it
    takes, not the whole document (a book can hold 10^5 sentences)."""

    def __init__(self, sentences: pa.ListArray):
        self.sentences = sentences

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, position):
        if isinstance(position, slice):
            return self.sentences.to_pylist()[position]
        return self.sentences[position].as_py()

    def __iter__(self):
        return iter(self.sentences.to_pylist())


class _DocumentView(Sequence):
    """Random access to tokenised documents without loading the corpus into memory."""

    def __init__(self, tokenized: datasets.Dataset):
        self.tokenized = tokenized.select_columns(["sentence_ids"]).with_format("arrow")

    def __len__(self) -> int:
        return len(self.tokenized)

    def __getitem__(self, index) -> _ArrowDocument:
        return _ArrowDocument(self.tokenized[index].column("sentence_ids")[0].values)


def add_pair_rows(out: dict, documents, index: int, rng: random.Random, *, sentence_task: str,
                   max_seq_length: int, short_seq_prob: float, cls_id: int, sep_id: int) -> None:
    for instance in pair_instances_from_document(
            documents, index, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
            rng=rng, sentence_task=sentence_task):
        row = model_inputs(instance, cls_id, sep_id)
        for key, value in row.items():
            out[key].append(value)
        out["length"].append(len(row["input_ids"]))


def packed_columns(documents, *, max_seq_length: int, cls_id: int, sep_id: int) -> dict:
    rows = pack_full_sentences(documents, max_seq_length=max_seq_length, cls_id=cls_id,
                               sep_id=sep_id)
    return {key: [row[key] for row in rows] for key in PACKED_COLUMNS}


def pair_instances_dataset(tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                           max_seq_length: int, short_seq_prob: float, seed: int,
                           copies: int = 1, num_proc: int | None = None,
                           sentence_task: str = "nsp") -> datasets.Dataset:
    """input_ids, token_type_ids, next_sentence_label and length, `copies` times over.

    sentence_task "sop" makes sentence order pairs; their label keeps the NSP column name."""
    check_sentence_task(sentence_task)
    view = _DocumentView(tokenized)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict, indices: list[int], copy: int) -> dict:
        out = {key: [] for key in PAIR_COLUMNS}
        for index in indices:
            add_pair_rows(out, view, index, random.Random(f"{seed}-{copy}-{index}"),
                           sentence_task=sentence_task, max_seq_length=max_seq_length,
                           short_seq_prob=short_seq_prob, cls_id=cls_id, sep_id=sep_id)
        return out

    parts = [tokenized.map(build, batched=True, with_indices=True, fn_kwargs={"copy": copy},
                           remove_columns=tokenized.column_names, num_proc=num_proc,
                           desc=f"{sentence_task.upper()} instances, copy {copy + 1}")
             for copy in range(copies)]
    return datasets.concatenate_datasets(parts)


def packed_sequences_dataset(tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                             max_seq_length: int, num_proc: int | None = None,
                             batch_size: int = 1000) -> datasets.Dataset:
    """input_ids, token_type_ids and length of full-sentence packed sequences for MLM alone.

    Packing crosses documents only within one map batch of batch_size documents, so the last
    sequence of each batch may be short. With num_proc the dataset is first cut into num_proc
    contiguous shards and batches restart at each shard, so the output depends on num_proc
    only at the shard boundaries."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict) -> dict:
        return packed_columns(batch["sentence_ids"], max_seq_length=max_seq_length,
                               cls_id=cls_id, sep_id=sep_id)

    return tokenized.map(build, batched=True, batch_size=batch_size, num_proc=num_proc,
                         remove_columns=tokenized.column_names, desc="Packing full sentences")


def streaming_instances(tokenized: datasets.IterableDataset, tokenizer: PreTrainedTokenizerBase,
                        *, objective: str, max_seq_length: int, short_seq_prob: float, seed: int,
                        buffer_documents: int = 1000) -> datasets.IterableDataset:
    """Training inputs built lazily, buffer_documents tokenised documents at a time.

    The objective (its name) builds each buffer's rows (Objective.buffer_rows): for NSP,
    NotNext segments come from the other documents of the same buffer, so a buffer of a single
    document (the last one of a stream, say) gives no NSP instances; MLM alone packs full
    sentences across the documents of a buffer. Each buffer's generator is seeded by (seed,
    index of its first document in the stream this process reads), so iteration is
    reproducible; with several DataLoader workers each worker counts from 0 over its own
    shards."""
    chosen = objective_named(objective)
    chosen.check_stream(buffer_documents)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def build(batch: dict, indices: list[int]) -> dict:
        return chosen.buffer_rows(batch["sentence_ids"],
                                  random.Random(f"{seed}-stream-{indices[0]}"),
                                  max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                                  cls_id=cls_id, sep_id=sep_id)

    return tokenized.select_columns(["sentence_ids"]).map(
        build, batched=True, batch_size=buffer_documents, with_indices=True,
        remove_columns=["sentence_ids"])

"""FULL-SENTENCES packing: every token once and in order, whole sentences unless one is longer
than the budget, [SEP] between documents, a sequence closed only when the next sentence does
not fit; the datasets.map wrapper packs within each batch.

Every token id here is (doc + 1) * 100000 + position in the document, so where each token
came from can be read off it; [CLS] and [SEP] are 1 and 2."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.pretraining.objective import pack_full_sentences, packed_sequences_dataset

STRIDE, CLS, SEP = 100_000, 1, 2


def corpus(n_docs: int = 60, seed: int = 0) -> list[list[list[int]]]:
    """Sentences of 1 to 40 tokens, so some outgrow a budget of 30."""
    rng = random.Random(seed)
    documents = []
    for doc in range(n_docs):
        position, sentences = 0, []
        for _ in range(rng.randint(1, 8)):
            length = rng.randint(1, 40) if rng.random() < 0.2 else rng.randint(1, 12)
            sentences.append([(doc + 1) * STRIDE + position + k for k in range(length)])
            position += length
        documents.append(sentences)
    return documents


def doc_of(token: int) -> int:
    return token // STRIDE - 1


def pack(documents, max_seq_length=32):
    return pack_full_sentences(documents, max_seq_length=max_seq_length, cls_id=CLS,
                               sep_id=SEP)


def contents(sequences) -> list[list[int]]:
    """What lies between [CLS] and the closing [SEP], document separators included."""
    for row in sequences:
        ids = row["input_ids"]
        assert ids[0] == CLS and ids[-1] == SEP
        assert row["token_type_ids"] == [0] * len(ids) and row["length"] == len(ids)
    return [row["input_ids"][1:-1] for row in sequences]


@pytest.mark.parametrize("max_seq_length", [3, 8, 32, 128])
def test_every_token_once_in_order_within_the_length(max_seq_length):
    documents = corpus()
    sequences = pack(documents, max_seq_length)
    assert all(row["length"] <= max_seq_length for row in sequences)
    packed = [t for content in contents(sequences) for t in content if t != SEP]
    assert packed == [t for document in documents for sentence in document for t in sentence]


def test_sentences_are_split_only_when_longer_than_the_budget():
    documents, budget = corpus(), 30
    sequence_of = {t: i for i, content in enumerate(contents(pack(documents))) for t in content}
    long_ones = 0
    for document in documents:
        for sentence in document:
            spanned = {sequence_of[t] for t in sentence}
            assert len(spanned) == max(1, math.ceil(len(sentence) / budget))
            long_ones += len(sentence) > budget
    assert long_ones > 5


def test_documents_share_sequences_with_a_sep_between_them():
    separators = 0
    for content in contents(pack(corpus())):
        assert content[0] != SEP and content[-1] != SEP
        for i in range(1, len(content)):
            if content[i] == SEP:
                separators += 1
                assert doc_of(content[i + 1]) == doc_of(content[i - 1]) + 1
            elif content[i - 1] != SEP:
                assert doc_of(content[i]) == doc_of(content[i - 1])  # a boundary needs a [SEP]
    assert separators > 20


def test_a_sequence_is_closed_only_when_the_next_sentence_does_not_fit():
    documents, budget = corpus(), 30
    sentence_of = {t: (d, s) for d, document in enumerate(documents)
                   for s, sentence in enumerate(document) for t in sentence}
    packed = contents(pack(documents))
    for content, following in zip(packed, packed[1:], strict=False):
        # The next unit: the next sentence, or the next piece of an over-long one.
        unit = 1
        while unit < len(following) and following[unit] != SEP and \
                sentence_of[following[unit]] == sentence_of[following[0]]:
            unit += 1
        separator = doc_of(following[0]) != doc_of(content[-1])
        assert len(content) + separator + unit > budget


def test_a_budget_below_one_token_is_refused():
    with pytest.raises(BertkitError, match="max_seq_length"):
        pack([[[5, 6]]], max_seq_length=2)


def test_dataset_packs_within_each_map_batch():
    documents = corpus(n_docs=40)
    tokenized = datasets.Dataset.from_dict({"sentence_ids": documents, "title": ["t"] * 40})
    tokenizer = SimpleNamespace(cls_token_id=CLS, sep_token_id=SEP)
    packed = packed_sequences_dataset(tokenized, tokenizer, max_seq_length=32, batch_size=16)
    assert packed.column_names == ["input_ids", "token_type_ids", "length"]
    expected = [row for start in range(0, 40, 16) for row in pack(documents[start:start + 16])]
    assert packed.to_list() == expected
    # Two processes: one batch per shard of 20 documents, the output changes at the shard edge.
    two = packed_sequences_dataset(tokenized, tokenizer, max_seq_length=32, batch_size=40,
                                   num_proc=2)
    assert two.to_list() == pack(documents[:20]) + pack(documents[20:])

"""The pretraining data pipeline on datasets: documents to NSP or SOP instances, deterministic
whatever the process count, with the layout BertForPreTraining expects; and the streaming
path over an IterableDataset, where NotNext text comes from the same buffer of documents."""

from __future__ import annotations

from types import SimpleNamespace

import datasets
import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertkit.errors import BertkitError
from bertkit.pretraining.objective import (
    IS_NEXT,
    NOT_NEXT,
    documents_dataset,
    pack_full_sentences,
    pair_instances_dataset,
    streaming_instances,
    tokenize_documents,
)
from tests.pretraining.test_nsp_instances import STRIDE, contiguous, corpus

CLS, SEP = -1, -2  # outside the corpus' token ids

WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vocab")
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
    return BertTokenizerFast.from_pretrained(str(directory))


def generated_documents(n: int = 40, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(WORDS, size=rng.integers(4, 15))) + " ."
             for _ in range(rng.integers(2, 12))] for _ in range(n)]


def test_instances_have_the_pretraining_layout(tokenizer):
    documents = generated_documents()
    tokenized = tokenize_documents(documents_dataset(documents), tokenizer)
    assert len(tokenized) == 40
    first = tokenized[0]["sentence_ids"]
    assert first[0] == tokenizer(documents[0][0], add_special_tokens=False)["input_ids"]

    instances = pair_instances_dataset(tokenized, tokenizer, max_seq_length=48,
                                       short_seq_prob=0.1, seed=3, copies=2)
    assert set(instances.column_names) == {"input_ids", "token_type_ids",
                                           "next_sentence_label", "length"}
    for row in instances:
        ids, types = row["input_ids"], row["token_type_ids"]
        assert len(ids) == len(types) == row["length"] <= 48
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert ids.count(tokenizer.sep_token_id) == 2
        boundary = ids.index(tokenizer.sep_token_id)
        assert types == [0] * (boundary + 1) + [1] * (len(ids) - boundary - 1)
    labels = np.array(instances["next_sentence_label"])
    assert set(labels) <= {0, 1} and 0.3 < labels.mean() < 0.7
    half = len(instances) // 2
    # The two copies cut the documents differently.
    assert instances[:half]["input_ids"] != instances[half:]["input_ids"]


def test_instances_do_not_depend_on_the_process_count(tokenizer):
    tokenized = tokenize_documents(documents_dataset(generated_documents(seed=1)), tokenizer)
    one = pair_instances_dataset(tokenized, tokenizer, max_seq_length=32, short_seq_prob=0.1,
                                 seed=5)
    two = pair_instances_dataset(tokenized, tokenizer, max_seq_length=32, short_seq_prob=0.1,
                                 seed=5, num_proc=2)
    assert one["input_ids"] == two["input_ids"]
    assert one["next_sentence_label"] == two["next_sentence_label"]


def test_arrow_documents_give_the_same_instances_as_in_memory_lists(tokenizer):
    """The dataset path reads documents lazily from Arrow (after a filter, through an index
    mapping); its instances equal pair_instances_from_document on plain lists, row by row."""
    import random

    from bertkit.pretraining.objective import model_inputs, pair_instances_from_document

    documents = generated_documents(seed=2) + [[]]  # the empty one is filtered out
    tokenized = tokenize_documents(documents_dataset(documents), tokenizer)
    assert len(tokenized) == 40 and tokenized._indices is not None
    in_memory = tokenized["sentence_ids"]
    expected = []
    for index in range(len(in_memory)):
        for instance in pair_instances_from_document(
                in_memory, index, max_seq_length=32, short_seq_prob=0.1,
                rng=random.Random(f"7-0-{index}")):
            expected.append(model_inputs(instance, tokenizer.cls_token_id,
                                         tokenizer.sep_token_id))
    instances = pair_instances_dataset(tokenized, tokenizer, max_seq_length=32,
                                       short_seq_prob=0.1, seed=7)
    assert instances["input_ids"] == [row["input_ids"] for row in expected]
    assert instances["next_sentence_label"] == [row["next_sentence_label"] for row in expected]
    assert 0.3 < np.mean(instances["next_sentence_label"]) < 0.7


def test_sop_instances_from_a_single_document(tokenizer):
    tokenized = tokenize_documents(documents_dataset(generated_documents(n=1, seed=2)),
                                   tokenizer)
    with pytest.raises(BertkitError, match="at least 2 documents"):
        pair_instances_dataset(tokenized, tokenizer, max_seq_length=24, short_seq_prob=0.0,
                               seed=0)
    sop = pair_instances_dataset(tokenized, tokenizer, max_seq_length=24, short_seq_prob=0.0,
                                 seed=0, copies=8, sentence_task="sop")
    assert set(sop.column_names) == {"input_ids", "token_type_ids", "next_sentence_label",
                                     "length"}
    assert set(sop["next_sentence_label"]) == {0, 1}
    assert max(sop["length"]) <= 24


def stream(documents) -> datasets.IterableDataset:
    return datasets.Dataset.from_dict({"sentence_ids": documents}).to_iterable_dataset()


def streamed(documents, objective, seed=0, buffer=16) -> list[dict]:
    ids = SimpleNamespace(cls_token_id=CLS, sep_token_id=SEP)
    return list(streaming_instances(stream(documents), ids, objective=objective,
                                    max_seq_length=64, short_seq_prob=0.1, seed=seed,
                                    buffer_documents=buffer))


def segments(row: dict) -> tuple[list[int], list[int]]:
    ids = row["input_ids"]
    boundary = ids.index(SEP)
    return ids[1:boundary], ids[boundary + 1:-1]


def test_tokenize_documents_streams_like_the_in_memory_path(tokenizer):
    documents = generated_documents(n=12, seed=4) + [["", " "]]  # the last one tokenises empty
    in_memory = tokenize_documents(documents_dataset(documents), tokenizer)
    streaming = tokenize_documents(documents_dataset(documents).to_iterable_dataset(),
                                   tokenizer)
    assert isinstance(streaming, datasets.IterableDataset)
    assert [row["sentence_ids"] for row in streaming] == in_memory["sentence_ids"]
    assert len(in_memory) == 12


def test_streaming_nsp_draws_not_next_from_the_same_buffer():
    documents = corpus(n_docs=81)  # the last buffer holds document 80 alone
    rows = streamed(documents, "mlm_nsp")
    assert len(rows) > 300
    assert {row["next_sentence_label"] for row in rows} == {IS_NEXT, NOT_NEXT}
    not_next = np.mean([row["next_sentence_label"] == NOT_NEXT for row in rows])
    assert 0.45 < not_next < 0.65  # one-sentence chunks are always NotNext
    a_docs = []
    for row in rows:
        assert row["length"] == len(row["input_ids"]) <= 64
        a, b = segments(row)
        assert contiguous(a) and contiguous(b)
        [a_doc], [b_doc] = {t // STRIDE for t in a}, {t // STRIDE for t in b}
        a_docs.append(a_doc)
        if row["next_sentence_label"] == NOT_NEXT:
            assert b_doc != a_doc and b_doc // 16 == a_doc // 16
        else:
            assert b_doc == a_doc and b[0] > a[-1]
    assert a_docs == sorted(a_docs) and max(a_docs) == 79


def test_streaming_sop_keeps_pairs_in_one_document():
    rows = streamed(corpus(n_docs=33), "sop")
    swapped = np.mean([row["next_sentence_label"] for row in rows])
    assert 0.4 < swapped < 0.6
    assert {t // STRIDE for t in segments(rows[-1])[0]} == {32}  # a lone document is enough
    for row in rows:
        a, b = segments(row)
        first, second = (b, a) if row["next_sentence_label"] else (a, b)
        assert {t // STRIDE for t in a + b} == {first[0] // STRIDE}
        assert contiguous(first) and contiguous(second) and second[0] > first[-1]


def test_streaming_mlm_packs_full_sentences_within_each_buffer():
    documents = corpus(n_docs=40)
    rows = streamed(documents, "mlm")
    assert set(rows[0]) == {"input_ids", "token_type_ids", "length"}
    expected = [row for start in range(0, 40, 16) for row in pack_full_sentences(
        documents[start:start + 16], max_seq_length=64, cls_id=CLS, sep_id=SEP)]
    assert rows == expected


def test_streaming_is_deterministic_for_a_seed():
    documents = corpus(n_docs=40)
    first = streamed(documents, "mlm_nsp", seed=7)
    assert streamed(documents, "mlm_nsp", seed=7) == first
    assert streamed(documents, "mlm_nsp", seed=8) != first


def test_streaming_refuses_an_unknown_objective():
    with pytest.raises(BertkitError, match="objective.name"):
        streamed(corpus(n_docs=4), "nsp")
    with pytest.raises(BertkitError, match="pretraining.streaming_buffer_documents"):
        streamed(corpus(n_docs=4), "mlm_nsp", buffer=1)

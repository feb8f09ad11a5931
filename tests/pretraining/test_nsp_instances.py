"""NSP pairs: about half IsNext; IsNext pairs are in-order text of one document, NotNext
segments B come from another document; lengths hold; unused sentences are not lost.
SOP pairs: adjacent text of one document, swapped about half the time.

Every token id here is doc * 100000 + position in the document, so where each token came
from can be read off it."""

from __future__ import annotations

import random

import pytest

from bertkit.errors import BertkitError
from bertkit.pretraining.objective import (
    IN_ORDER,
    IS_NEXT,
    NOT_NEXT,
    SWAPPED,
    PairInstance,
    model_inputs,
    pair_instances_from_document,
    truncate_pair,
)

STRIDE = 100_000


def corpus(n_docs: int = 80, seed: int = 0) -> list[list[list[int]]]:
    rng = random.Random(seed)
    documents = []
    for doc in range(n_docs):
        position, sentences = 0, []
        for _ in range(rng.randint(2, 30)):
            length = rng.randint(3, 25)
            sentences.append([doc * STRIDE + position + k for k in range(length)])
            position += length
        documents.append(sentences)
    return documents


def all_instances(documents, max_seq_length=64, short_seq_prob=0.1, seed=1,
                  sentence_task="nsp"):
    rng = random.Random(seed)
    return [(index, instance) for index in range(len(documents))
            for instance in pair_instances_from_document(
                documents, index, max_seq_length=max_seq_length,
                short_seq_prob=short_seq_prob, rng=rng, sentence_task=sentence_task)]


def original_order(instance: PairInstance) -> tuple[list[int], list[int]]:
    """SOP segments put back in document order."""
    a, b = instance.tokens_a, instance.tokens_b
    return (b, a) if instance.is_random_next else (a, b)


def contiguous(tokens: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(tokens, tokens[1:], strict=False))


def test_pairs_follow_the_original_recipe():
    documents = corpus()
    instances = all_instances(documents)
    assert len(instances) > 300
    is_next = sum(not inst.is_random_next for _, inst in instances) / len(instances)
    # Google's rule makes a one-sentence chunk always NotNext, so the share sits a bit below 0.5.
    assert 0.40 < is_next < 0.55  # 0.426 with this corpus and seed
    for index, inst in instances:
        assert len(inst.tokens_a) + len(inst.tokens_b) <= 64 - 3
        assert inst.tokens_a and inst.tokens_b
        assert {t // STRIDE for t in inst.tokens_a} == {index}
        assert contiguous(inst.tokens_a) and contiguous(inst.tokens_b)
        b_docs = {t // STRIDE for t in inst.tokens_b}
        if inst.is_random_next:
            assert len(b_docs) == 1 and index not in b_docs
        else:
            assert b_docs == {index}
            assert inst.tokens_b[0] > inst.tokens_a[-1]
            if len(inst.tokens_a) + len(inst.tokens_b) < 64 - 3:  # nothing truncated
                assert inst.tokens_b[0] == inst.tokens_a[-1] + 1


def test_unused_sentences_go_back_into_the_stream():
    documents = corpus(seed=3)
    covered = set()
    for _, inst in all_instances(documents, max_seq_length=512, short_seq_prob=0.0):
        covered.update(inst.tokens_a)
        if not inst.is_random_next:
            covered.update(inst.tokens_b)
    # With room for whole chunks nothing is truncated: every token of every document is used
    # as A or as a true continuation B exactly where it stands.
    every_token = {t for document in documents for sentence in document for t in sentence}
    assert covered == every_token


def test_short_seq_prob_makes_shorter_targets():
    documents = corpus(seed=4)
    lengths = {p: [len(i.tokens_a) + len(i.tokens_b) for _, i in
                   all_instances(documents, max_seq_length=128, short_seq_prob=p)]
               for p in (0.0, 1.0)}
    assert sum(lengths[1.0]) / len(lengths[1.0]) < 0.8 * sum(lengths[0.0]) / len(lengths[0.0])


def test_truncation_trims_front_and_back_of_the_longer_segment():
    rng = random.Random(0)
    fronts = backs = 0
    for _ in range(200):
        a, b = list(range(100)), list(range(1000, 1010))
        truncate_pair(a, b, 60, rng)
        assert len(a) + len(b) == 60 and b == list(range(1000, 1010))
        assert contiguous(a)
        fronts += a[0] > 0
        backs += a[-1] < 99
    assert fronts > 150 and backs > 150


def test_model_inputs_layout():
    inputs = model_inputs(PairInstance([5, 6], [7, 8, 9], True), cls_id=2, sep_id=3)
    assert inputs == {"input_ids": [2, 5, 6, 3, 7, 8, 9, 3],
                      "token_type_ids": [0, 0, 0, 0, 1, 1, 1, 1],
                      "next_sentence_label": NOT_NEXT}
    assert model_inputs(PairInstance([5], [6], False), 2, 3)["next_sentence_label"] == IS_NEXT


def test_one_document_is_not_enough():
    with pytest.raises(BertkitError, match="at least 2 documents"):
        pair_instances_from_document([[[1, 2], [3]]], 0, max_seq_length=16,
                                     short_seq_prob=0.1, rng=random.Random(0))


def test_sop_pairs_are_adjacent_text_swapped_half_the_time():
    documents = corpus()
    instances = all_instances(documents, sentence_task="sop")
    assert len(instances) > 300
    swapped = sum(inst.is_random_next for _, inst in instances) / len(instances)
    assert 0.43 < swapped < 0.57  # 0.491 with this corpus and seed
    for index, inst in instances:
        inputs = model_inputs(inst, cls_id=-1, sep_id=-2)
        assert len(inputs["input_ids"]) <= 64
        assert inputs["next_sentence_label"] == (SWAPPED if inst.is_random_next else IN_ORDER)
        assert inst.tokens_a and inst.tokens_b
        assert {t // STRIDE for t in inst.tokens_a + inst.tokens_b} == {index}
        first, second = original_order(inst)
        assert contiguous(first) and contiguous(second)
        assert second[0] > first[-1]  # as given when label 0, reversed when label 1
        if len(first) + len(second) < 64 - 3:  # nothing truncated
            assert second[0] == first[-1] + 1


def test_sop_without_truncation_uses_every_token_once_in_order():
    documents = corpus(seed=5)
    # Random targets from 2 up make many one-sentence chunks; no document outgrows 1021 tokens.
    instances = all_instances(documents, max_seq_length=1024, short_seq_prob=1.0,
                              sentence_task="sop")
    rebuilt: dict[int, list[int]] = {index: [] for index in range(len(documents))}
    for index, inst in instances:
        first, second = original_order(inst)
        rebuilt[index] += first + second
    for index, document in enumerate(documents):
        assert rebuilt[index] == [t for sentence in document for t in sentence]
    sentence_of = {t: (d, s) for d, document in enumerate(documents)
                   for s, sentence in enumerate(document) for t in sentence}
    cut_sentences = [inst for _, inst in instances
                     if len({sentence_of[t] for t in inst.tokens_a + inst.tokens_b}) == 1]
    assert len(cut_sentences) > 10  # 14 with this corpus and seed


def test_sop_cuts_a_lone_sentence_and_needs_one_document_only():
    cuts = set()
    for seed in range(50):
        instances = pair_instances_from_document([[[1, 2, 3, 4, 5]]], 0, max_seq_length=16,
                                                 short_seq_prob=0.0, rng=random.Random(seed),
                                                 sentence_task="sop")
        assert len(instances) == 1
        first, second = original_order(instances[0])
        assert first and second and first + second == [1, 2, 3, 4, 5]
        cuts.add(len(first))
    assert cuts == {1, 2, 3, 4}
    # The corpus that NSP rejects (test_one_document_is_not_enough) is enough for SOP.
    [instance] = pair_instances_from_document([[[1, 2], [3]]], 0, max_seq_length=16,
                                              short_seq_prob=0.0, rng=random.Random(0),
                                              sentence_task="sop")
    assert original_order(instance) == ([1, 2], [3])
    # A one-token sentence cannot be cut, so its chunk gives no pair.
    assert pair_instances_from_document([[[7]]], 0, max_seq_length=16, short_seq_prob=0.0,
                                        rng=random.Random(0), sentence_task="sop") == []


def test_unknown_sentence_task_names_the_config_key():
    with pytest.raises(BertkitError, match="objective.sentence_task"):
        pair_instances_from_document([[[1, 2], [3]], [[4]]], 0, max_seq_length=16,
                                     short_seq_prob=0.1, rng=random.Random(0),
                                     sentence_task="mlm")

"""The generated pretraining corpus: Google's format, determinism, vocabulary, coherence."""

from __future__ import annotations

import random
import re

import pytest
from transformers import BertTokenizerFast

from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import (
    FUNCTION_WORDS,
    SPECIAL_TOKENS,
    TOPICS,
    demo_vocabulary,
    ensure_demo_corpus,
    read_documents,
    write_demo_corpus,
)

SETTINGS = {"num_documents": 60, "min_sentences": 3, "max_sentences": 8, "min_words": 5,
            "max_words": 24, "num_topics": 5, "seed": 0}


def words_of(sentence: str) -> list[str]:
    return re.findall(r"[a-z]+", sentence)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo-corpus") / "corpus.txt"
    ensure_demo_corpus(path, SETTINGS)
    return path


def test_google_format_documents_and_sentence_counts(corpus):
    documents = list(read_documents([corpus], "google"))
    assert len(documents) == SETTINGS["num_documents"]
    assert all(SETTINGS["min_sentences"] <= len(doc) <= SETTINGS["max_sentences"]
               for doc in documents)
    # Both ends of the ranges occur, so the ranges are really drawn from.
    assert {len(doc) for doc in documents} >= {3, 8}
    lengths = [len(words_of(s)) for doc in documents for s in doc]
    assert min(lengths) >= SETTINGS["min_words"] and max(lengths) <= SETTINGS["max_words"]
    assert {min(lengths), max(lengths)} == {5, 24}
    sentences = [s for doc in documents for s in doc]
    assert all(s.endswith(".") and s == s.strip() for s in sentences)
    assert all(re.fullmatch(r"[a-z]+( [a-z]+)*\.", s) for s in sentences)


def test_same_seed_same_bytes_other_seed_other_text(tmp_path, corpus):
    again = write_demo_corpus(tmp_path / "again.txt", **SETTINGS)
    other = write_demo_corpus(tmp_path / "other.txt", **{**SETTINGS, "seed": 1})
    assert again.read_bytes() == corpus.read_bytes()
    assert other.read_bytes() != corpus.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_vocab_covers_every_word_and_tokenises_without_unk(corpus):
    vocab = demo_vocabulary()
    assert vocab[:5] == SPECIAL_TOKENS
    assert len(vocab) == len(set(vocab)) and len(vocab) > 300
    assert (corpus.parent / "vocab.txt").read_text().splitlines() == vocab
    text = corpus.read_text()
    assert set(words_of(text)) <= set(vocab)
    tokenizer = BertTokenizerFast.from_pretrained(str(corpus.parent))
    assert tokenizer.pad_token_id == 0
    ids = tokenizer(text.splitlines())["input_ids"]
    assert all(tokenizer.unk_token_id not in line for line in ids)
    # Whole words: each word is one token, so masking a token masks a word.
    line = next(line for line in text.splitlines() if line)
    assert tokenizer.tokenize(line) == words_of(line) + ["."]


def test_topic_word_lists_are_real_disjoint_lowercase_words():
    topic_words = [w for topic in TOPICS.values() for ws in topic.values() for w in ws]
    assert len(topic_words) == len(set(topic_words))
    assert not set(topic_words) & set(FUNCTION_WORDS)
    assert all(re.fullmatch(r"[a-z]+", w) for w in topic_words + FUNCTION_WORDS)


def test_consecutive_sentences_share_content_words_far_more_than_other_documents(corpus):
    documents = list(read_documents([corpus], "google"))

    def content(sentence: str) -> set[str]:
        return set(words_of(sentence)) - set(FUNCTION_WORDS)

    consecutive = [bool(content(a) & content(b))
                   for doc in documents for a, b in zip(doc, doc[1:], strict=False)]
    rng = random.Random(0)
    across = []
    for _ in range(2000):
        first, second = rng.sample(range(len(documents)), 2)
        across.append(bool(content(rng.choice(documents[first]))
                           & content(rng.choice(documents[second]))))
    consecutive_rate = sum(consecutive) / len(consecutive)
    across_rate = sum(across) / len(across)
    assert consecutive_rate == 1.0  # the subject is always carried over
    assert across_rate < 0.3
    # The next sentence's subject ("the [adjective] noun") is a noun of the one before.
    nouns = {noun for topic in TOPICS.values() for noun in topic["nouns"]}
    for doc in documents:
        for a, b in zip(doc, doc[1:], strict=False):
            determiner, *rest = words_of(b)
            subject = next(w for w in rest[:2] if w in nouns)
            assert determiner == "the" and subject in words_of(a)


def test_documents_keep_to_one_topic(corpus):
    topic_of = {w: name for name, topic in TOPICS.items() for ws in topic.values() for w in ws}
    documents = list(read_documents([corpus], "google"))
    topics_per_document = [{topic_of[w] for s in doc for w in words_of(s) if w in topic_of}
                           for doc in documents]
    assert all(len(topics) == 1 for topics in topics_per_document)
    used = set().union(*topics_per_document)
    assert used == set(list(TOPICS)[:SETTINGS["num_topics"]])


def test_ensure_does_not_rewrite_and_bad_settings_raise(tmp_path):
    path = tmp_path / "corpus.txt"
    ensure_demo_corpus(path, {**SETTINGS, "num_documents": 3})
    path.write_text("kept\n")
    ensure_demo_corpus(path, {**SETTINGS, "num_documents": 3})
    assert path.read_text() == "kept\n"
    assert (tmp_path / "vocab.txt").is_file()
    with pytest.raises(BertkitError, match="num_topics"):
        write_demo_corpus(tmp_path / "x.txt", **{**SETTINGS, "num_topics": len(TOPICS) + 1})
    with pytest.raises(BertkitError, match="min_words"):
        write_demo_corpus(tmp_path / "x.txt", **{**SETTINGS, "min_words": 2})
    with pytest.raises(BertkitError, match="min_sentences"):
        write_demo_corpus(tmp_path / "x.txt", **{**SETTINGS, "min_sentences": 9})
    assert not (tmp_path / "x.txt").exists()

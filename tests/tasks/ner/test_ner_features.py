"""Word / WordPiece label alignment, exact position by position: first sub-token (the paper)
and all sub-tokens; document context labelled -100 and drawn only from the same document;
long sentences cut into several targets; predictions mapped back to words; the disk cache."""

from __future__ import annotations

import random

import datasets
import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.ner.data import FEATURES as SENTENCE_FEATURES
from bertkit.tasks.ner.features import (
    FEATURES,
    IGNORED,
    build_features,
    continuation_labels,
    feature_splits,
    word_predictions,
)
from bertkit.tasks.ner.files import NO_DOCUMENT
from tests.ner_fixtures import ID, LABELS, make_tokenizer

X = IGNORED


def sentences(rows, documents=None) -> datasets.Dataset:
    """rows: [(words, tags)]; documents: one id per sentence (all 0 by default)."""
    return datasets.Dataset.from_dict({
        "tokens": [list(words) for words, _ in rows],
        "ner_tags": [[ID[t] for t in tags] for _, tags in rows],
        "document": documents or [0] * len(rows),
        "line": list(range(len(rows))),
    }, features=SENTENCE_FEATURES)


@pytest.fixture
def tokenizer(tmp_path):
    return make_tokenizer(tmp_path / "vocab")


def build(table, tokenizer, **settings):
    """(feature columns as lists, counts)."""
    settings.setdefault("max_seq_length", 128)
    features, counts = build_features(table, tokenizer, continuation=continuation_labels(LABELS),
                                      **settings)
    return features.to_dict(), counts


def pieces(tokenizer, ids):
    return tokenizer.convert_ids_to_tokens(ids)


# Johnson = John ##son, Yorker = York ##er, Parisian = Paris ##ian, AcmeCorp = Acme ##Corp.
SENTENCE = (["Johnson", "went", "to", "New", "Yorker", "with", "Parisian", "AcmeCorp", "."],
            ["B-PER", "O", "O", "B-LOC", "I-LOC", "O", "B-MISC", "B-ORG", "O"])
TOKENS = ["[CLS]", "John", "##son", "went", "to", "New", "York", "##er", "with", "Paris",
          "##ian", "Acme", "##Corp", ".", "[SEP]"]


def test_first_subtoken_labels(tokenizer):
    columns, counts = build(sentences([SENTENCE]), tokenizer)
    assert pieces(tokenizer, columns["input_ids"][0]) == TOKENS
    per, loc, inside_loc, misc, org, out = (
        ID[t] for t in ("B-PER", "B-LOC", "I-LOC", "B-MISC", "B-ORG", "O"))
    assert columns["labels"][0] == [X, per, X, out, out, loc, inside_loc, X, out, misc, X, org,
                                    X, out, X]
    assert columns["word_positions"][0] == [1, 3, 4, 5, 6, 8, 9, 11, 13]
    assert columns["word_labels"][0] == [ID[t] for t in SENTENCE[1]]
    assert columns["attention_mask"][0] == [1] * 15 and columns["token_type_ids"][0] == [0] * 15
    assert columns["length"] == [15] and columns["sentence"] == [0]
    assert counts == {"sentences": 1, "features": 1, "split_sentences": 0, "cut_words": 0,
                      "empty_words": 0}


def test_all_subtoken_labels_continue_b_with_i(tokenizer):
    columns, _ = build(sentences([SENTENCE]), tokenizer, label_all_subtokens=True)
    assert pieces(tokenizer, columns["input_ids"][0]) == TOKENS
    # John ##son: B-PER I-PER; York ##er (I-LOC): I-LOC I-LOC; Paris ##ian: B-MISC I-MISC;
    # Acme ##Corp: B-ORG I-ORG.
    assert columns["labels"][0] == [X, ID["B-PER"], ID["I-PER"], 0, 0, ID["B-LOC"], ID["I-LOC"],
                                    ID["I-LOC"], 0, ID["B-MISC"], ID["I-MISC"], ID["B-ORG"],
                                    ID["I-ORG"], 0, X]
    # Predictions are still read at the first sub-token.
    assert columns["word_positions"][0] == [1, 3, 4, 5, 6, 8, 9, 11, 13]


def test_continuation_labels():
    assert [LABELS[i] for i in continuation_labels(LABELS)] == [
        "O", "I-PER", "I-PER", "I-ORG", "I-ORG", "I-LOC", "I-LOC", "I-MISC", "I-MISC"]
    with pytest.raises(BertkitError, match="B-ORG but no I-ORG"):
        continuation_labels(["O", "B-ORG"])


def test_word_without_pieces_is_predicted_o(tokenizer):
    table = sentences([(["John", "\u200b", "Paris"], ["B-PER", "B-LOC", "B-LOC"])])
    columns, counts = build(table, tokenizer)
    assert pieces(tokenizer, columns["input_ids"][0]) == ["[CLS]", "John", "Paris", "[SEP]"]
    assert columns["labels"][0] == [X, ID["B-PER"], ID["B-LOC"], X]
    assert columns["word_positions"][0] == [1, -1, 2]
    assert counts["empty_words"] == 1
    predictions = np.array([[0, ID["B-PER"], ID["I-LOC"], 0]])
    gold, predicted = word_predictions(datasets.Dataset.from_dict(columns), predictions)
    assert gold == [[ID["B-PER"], ID["B-LOC"], ID["B-LOC"]]]
    assert predicted == [[ID["B-PER"], ID["O"], ID["I-LOC"]]]


def docs_table():
    """doc 0: S0 = A1..A4, S1 = B1..B3, S2 = C1..C4; doc 1: S3 = D1 D2, S4 = E1..E3."""
    words = [["A1", "A2", "A3", "A4"], ["B1", "B2", "B3"], ["C1", "C2", "C3", "C4"],
             ["D1", "D2"], ["E1", "E2", "E3"]]
    rows = [(w, ["B-PER"] + ["O"] * (len(w) - 1)) for w in words]
    return sentences(rows, documents=[0, 0, 0, 1, 1])


def vocab_with(tmp_path, words):
    from tests.ner_fixtures import write_vocab

    directory = write_vocab(tmp_path / "docs_vocab")
    with (directory / "vocab.txt").open("a") as handle:
        handle.write("\n".join(words) + "\n")
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(directory), do_lower_case=False)


def test_document_context_fills_both_sides_within_the_document(tmp_path):
    words = [f"{c}{i}" for c in "ABCDE" for i in range(1, 5)]
    tokenizer = vocab_with(tmp_path, words)
    columns, counts = build(docs_table(), tokenizer, max_seq_length=12, document_context=True)
    text = [pieces(tokenizer, ids) for ids in columns["input_ids"]]
    # S1: 7 tokens of room, alternately left and right from the nearest word.
    assert text[1] == ["[CLS]", "A1", "A2", "A3", "A4", "B1", "B2", "B3", "C1", "C2", "C3",
                       "[SEP]"]
    assert columns["labels"][1] == [X] * 5 + [ID["B-PER"], 0, 0] + [X] * 4
    assert columns["word_positions"][1] == [5, 6, 7]
    # S2 is the last sentence of document 0: all its context is on the left, none from D.
    assert text[2] == ["[CLS]", "A2", "A3", "A4", "B1", "B2", "B3", "C1", "C2", "C3", "C4",
                       "[SEP]"]
    assert columns["labels"][2] == [X] * 7 + [ID["B-PER"], 0, 0, 0, X]
    # S3 starts document 1: nothing from document 0.
    assert text[3] == ["[CLS]", "D1", "D2", "E1", "E2", "E3", "[SEP]"]
    assert columns["labels"][3] == [X, ID["B-PER"], 0, X, X, X, X]
    assert text[0] == ["[CLS]", "A1", "A2", "A3", "A4", "B1", "B2", "B3", "C1", "C2", "C3",
                       "[SEP]"]
    assert columns["labels"][0] == [X, ID["B-PER"], 0, 0, 0] + [X] * 7
    assert counts["features"] == 5
    # Without document context a sentence that fits is alone.
    columns, _ = build(docs_table(), tokenizer, max_seq_length=12)
    assert pieces(tokenizer, columns["input_ids"][1]) == ["[CLS]", "B1", "B2", "B3", "[SEP]"]


def test_document_context_properties_on_random_documents(tmp_path):
    """Random documents of multi-piece words: every target word is labelled exactly where
    its first piece is, every other position is -100, no feature is longer than
    max_seq_length, and every context word comes from the target's own document."""
    rng = random.Random(3)
    stems = [f"S{s}W{i}" for s in range(60) for i in range(12)]
    tokenizer = vocab_with(tmp_path, stems + ["##p", "##q"])
    rows, documents, document = [], [], 0
    for s in range(60):
        if rng.random() < 0.25:
            document += 1
        words = [f"S{s}W{i}" + rng.choice(["", "", "p", "pq"]) for i in range(rng.randint(1, 12))]
        tags = [rng.choice(LABELS) for _ in words]
        rows.append((words, tags))
        documents.append(document)
    table = sentences(rows, documents)
    continuation = continuation_labels(LABELS)
    for max_seq_length in (8, 20, 64):
        for all_pieces in (False, True):
            columns, _ = build(table, tokenizer, max_seq_length=max_seq_length,
                               document_context=True, label_all_subtokens=all_pieces)
            seen = {s: [] for s in range(len(rows))}
            for ids, labels, positions, word_labels, s in zip(
                    columns["input_ids"], columns["labels"], columns["word_positions"],
                    columns["word_labels"], columns["sentence"], strict=True):
                assert len(ids) <= max_seq_length
                tokens = pieces(tokenizer, ids)
                # Which sentence each piece belongs to (S<sentence>W<word>, ## pieces follow).
                owner, owners = None, []
                for token in tokens:
                    if token.startswith("S"):
                        owner = int(token[1:token.index("W")])
                    owners.append(owner if token.startswith(("S", "##")) else None)
                assert {documents[o] for o in owners if o is not None} == {documents[s]}
                # Labels sit on the target words' pieces only: the first piece of each word,
                # or all of them (continuation pieces of B-X with I-X).
                labelled = [i for i, label in enumerate(labels) if label != X]
                expected = []
                for p in positions:
                    expected.append(p)
                    j = p + 1
                    while all_pieces and tokens[j].startswith("##"):
                        assert labels[j] == continuation[labels[p]]
                        expected.append(j)
                        j += 1
                assert labelled == expected
                assert all(owners[i] == s for i in labelled)
                assert [labels[p] for p in positions] == word_labels
                assert all(tokens[p].startswith("S") for p in positions)
                seen[s].extend(tokens[p] for p in positions)
            # Every word of every sentence is a target exactly once, in order.
            for s, (words, _) in enumerate(rows):
                assert seen[s] == [w.rstrip("pq") for w in words]


def test_long_sentence_is_cut_into_targets_that_see_each_other(tokenizer):
    words = ["Johnson"] * 5 + ["went"] * 4  # 14 pieces
    tags = ["B-PER"] * 5 + ["O"] * 4
    columns, counts = build(sentences([(words, tags)]), tokenizer, max_seq_length=8)
    assert counts["split_sentences"] == 1 and counts["features"] == 3
    assert columns["sentence"] == [0, 0, 0]
    # Room 6, cut at word boundaries: Johnson x3 | Johnson x2 went x2 | went x2.
    assert [len(p) for p in columns["word_positions"]] == [3, 4, 2]
    assert all(length <= 8 for length in columns["length"])
    # Targets of 6, 6 and 2 pieces: the first two fill their sequence; the last (went went)
    # sees the end of its sentence before it, whole words only.
    assert pieces(tokenizer, columns["input_ids"][1]) == [
        "[CLS]", "John", "##son", "John", "##son", "went", "went", "[SEP]"]
    assert pieces(tokenizer, columns["input_ids"][2]) == [
        "[CLS]", "John", "##son", "went", "went", "went", "went", "[SEP]"]
    assert columns["labels"][2] == [X, X, X, X, X, 0, 0, X]
    assert columns["word_positions"][2] == [5, 6]
    assert columns["labels"][0] == [X, ID["B-PER"], X, ID["B-PER"], X, ID["B-PER"], X, X]
    # Oracle predictions on the first pieces, garbage on the others: the words come back.
    predictions = np.full((3, 8), ID["I-MISC"])
    for row, (positions, labels) in enumerate(zip(columns["word_positions"],
                                                  columns["word_labels"], strict=True)):
        predictions[row, positions] = labels
    gold, predicted = word_predictions(datasets.Dataset.from_dict(columns), predictions)
    assert gold == predicted == [[ID[t] for t in tags]]


def test_document_context_needs_documents(tokenizer):
    table = sentences([SENTENCE], documents=[NO_DOCUMENT])
    with pytest.raises(BertkitError, match="document_context=true needs the document"):
        build(table, tokenizer, document_context=True)
    build(table, tokenizer)  # fine without it


def test_features_are_cached_by_data_tokenizer_and_settings(tokenizer, tmp_path, monkeypatch):
    from bertkit.tasks.ner import features as ner_features

    table = sentences([SENTENCE, (["went"], ["O"])])
    splits = TaskSplits({"validation": table}, {"validation": "data1"})
    calls = []
    real = ner_features.build_features
    monkeypatch.setattr(ner_features, "build_features",
                        lambda *a, **k: calls.append(k) or real(*a, **k))

    def run(tokenizer=tokenizer, **settings):
        options = dict(labels=LABELS, max_seq_length=128, label_all_subtokens=False,
                       document_context=False, cache_dir=tmp_path / "cache")
        return feature_splits(splits, tokenizer, **{**options, **settings})

    first, counts = run()
    again, _ = run()
    assert len(calls) == 1
    assert again["validation"]["labels"] == first["validation"]["labels"]
    assert counts["validation"]["sentences"] == 2
    run(label_all_subtokens=True)
    run(max_seq_length=64)
    assert len(calls) == 3
    lowercasing = BertTokenizerFast.from_pretrained(str(tmp_path / "vocab"), do_lower_case=True)
    run(tokenizer=lowercasing)  # same vocabulary, other rules: other features
    assert len(calls) == 4
    splits.fingerprints["validation"] = "data2"
    run()
    assert len(calls) == 5


def test_processes_build_the_same_features_and_counts(tokenizer, tmp_path, monkeypatch):
    """preprocessing_num_workers reaches feature building, and 2 processes split the work by
    whole documents: the features (context across sentences, a sentence cut into two targets)
    and the counts are those of one process."""
    long = (SENTENCE[0] * 3, SENTENCE[1] * 3)
    table = sentences([SENTENCE, (["went"], ["O"]), long, SENTENCE, (["to"], ["O"]), long],
                      documents=[0, 0, 0, 1, 1, 2])
    settings = {"max_seq_length": 24, "document_context": True, "label_all_subtokens": True}
    one, one_counts = build(table, tokenizer, **settings)
    two, two_counts = build(table, tokenizer, num_proc=2, **settings)
    assert two == one and two_counts == one_counts
    assert one_counts["split_sentences"] == 2 and one_counts["sentences"] == 6
    assert one_counts["features"] == len(one["input_ids"]) > 6

    from bertkit.tasks.ner import features as ner_features
    from bertkit.tasks.ner.family import FAMILY
    from tests.conftest import compose_config

    seen = []
    real = ner_features.build_features
    monkeypatch.setattr(ner_features, "build_features",
                        lambda *a, **k: seen.append(k["num_proc"]) or real(*a, **k))
    cfg = compose_config(["recipe=ner", "preprocessing_num_workers=2", "task.max_seq_length=24",
                          "task.document_context=true", f"cache_dir={tmp_path / 'cache'}"])
    splits = TaskSplits({"train": table}, {"train": "d"}, {"train": {"tag_scheme": "iob2"}})
    data = FAMILY.featurize(cfg.task, splits, tokenizer, cfg.cache_dir,
                            cfg.preprocessing_num_workers)
    assert seen == [2]
    assert data.facts == {"data": {"train": {**one_counts, "tag_scheme": "iob2"}}}


def test_an_empty_split_has_no_features(tokenizer):
    columns, counts = build(sentences([]), tokenizer, document_context=True)
    assert columns == {name: [] for name in FEATURES}
    assert counts == {"sentences": 0, "features": 0, "split_sentences": 0, "cut_words": 0,
                      "empty_words": 0}

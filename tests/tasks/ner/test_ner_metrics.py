"""Entity-level scores against hand counts and against an independent port of conlleval's
chunk rules (I- after O starts an entity), and the prediction file read back."""

from __future__ import annotations

import random

import pytest

from bertkit.tasks.ner.metrics import entity_scores, entity_types, write_conll_predictions
from tests.ner_fixtures import LABELS, read_columns

TYPES = ["PER", "ORG", "LOC", "MISC"]


def test_entity_types_in_label_order():
    assert entity_types(LABELS) == TYPES


def test_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-MISC"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "O", "I-MISC"]]
    # Gold: PER 0-1, LOC 3 | ORG 0-2, MISC 4. Predicted: PER 0-1, ORG 3 | ORG 0-1, MISC 4
    # (an I- after O starts an entity, as in conlleval). Correct: PER and MISC.
    scores = entity_scores(gold, predicted, TYPES)
    assert scores["precision"] == scores["recall"] == scores["f1"] == 0.5
    assert scores["accuracy"] == pytest.approx(6 / 9)
    assert scores["entities"] == 4
    assert (scores["precision_PER"], scores["recall_PER"], scores["f1_PER"]) == (1, 1, 1)
    assert (scores["precision_MISC"], scores["recall_MISC"]) == (1, 1)
    assert (scores["precision_ORG"], scores["recall_ORG"], scores["f1_ORG"]) == (0, 0, 0)
    assert (scores["precision_LOC"], scores["recall_LOC"], scores["support_LOC"]) == (0, 0, 1)
    assert scores["support_ORG"] == 1


def test_types_without_entities_are_reported_as_zero():
    scores = entity_scores([["B-PER", "O"]], [["B-PER", "O"]], TYPES)
    assert scores["f1"] == 1.0
    assert scores["f1_LOC"] == 0.0 and scores["support_LOC"] == 0
    assert list(scores)[5:9] == ["precision_PER", "recall_PER", "f1_PER", "support_PER"]
    with pytest.raises(ValueError):
        entity_scores([["O", "O"]], [["O"]])


def conlleval_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, start, end) of each chunk by conlleval.pl's startOfChunk / endOfChunk."""
    chunks, start, previous, previous_type = set(), None, "O", ""
    for i, label in enumerate([*tags, "O"]):
        tag, kind = (label[0], label[2:]) if label != "O" else ("O", "")
        ends = (previous in ("B", "I") and tag in ("B", "O")) or \
            (previous != "O" and previous_type != kind)
        starts = (tag == "B") or (previous == "O" and tag == "I") or \
            (tag != "O" and previous_type != kind)
        if start is not None and ends:
            chunks.add((previous_type, start, i - 1))
            start = None
        if starts:
            start = i
        previous, previous_type = tag, kind
    return chunks


def conlleval_scores(gold, predicted) -> dict[str, float]:
    counts = {name: [0, 0, 0] for name in [None, *TYPES]}  # correct, predicted, gold
    for g, p in zip(gold, predicted, strict=True):
        gold_chunks, predicted_chunks = conlleval_chunks(g), conlleval_chunks(p)
        for chunks, column in ((gold_chunks & predicted_chunks, 0), (predicted_chunks, 1),
                               (gold_chunks, 2)):
            for chunk in chunks:
                counts[None][column] += 1
                counts[chunk[0]][column] += 1
    out = {}
    for name, (correct, found, real) in counts.items():
        suffix = "" if name is None else f"_{name}"
        precision = correct / found if found else 0.0
        recall = correct / real if real else 0.0
        out[f"precision{suffix}"] = precision
        out[f"recall{suffix}"] = recall
        out[f"f1{suffix}"] = (2 * precision * recall / (precision + recall)
                              if precision + recall else 0.0)
    return out


def test_scores_equal_conlleval_on_random_sequences():
    rng = random.Random(0)
    for _ in range(30):
        gold, predicted = [], []
        for _ in range(rng.randint(1, 20)):
            n = rng.randint(1, 12)
            # Gold: valid IOB2; predicted: any tags, invalid sequences included.
            tags, previous = [], "O"
            for _ in range(n):
                tag = rng.choice(["O", "O", "B-PER", "B-ORG", "B-LOC", "B-MISC"])
                if previous != "O" and rng.random() < 0.5:
                    tag = "I-" + previous[2:]
                tags.append(tag)
                previous = tag
            gold.append(tags)
            predicted.append([t if rng.random() < 0.7 else rng.choice(LABELS) for t in tags])
        ours = entity_scores(gold, predicted, TYPES)
        reference = conlleval_scores(gold, predicted)
        for key, value in reference.items():
            assert ours[key] == pytest.approx(value), key


def test_prediction_file_reads_back_to_the_same_scores(tmp_path):
    from seqeval.metrics import f1_score, precision_score, recall_score

    tokens = [["EU", "rejects", "German"], ["Peter", "Black burn"]]
    gold = [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]
    predicted = [["B-ORG", "O", "O"], ["B-PER", "B-PER"]]
    path = write_conll_predictions(tmp_path / "predictions" / "validation.txt", tokens, gold,
                                   predicted)
    assert path.read_text() == ("EU B-ORG B-ORG\nrejects O O\nGerman B-MISC O\n\n"
                                "Peter B-PER B-PER\nBlack_burn I-PER B-PER\n\n")
    columns = read_columns(path)
    file_gold = [[fields[1] for fields in s] for s in columns]
    file_predicted = [[fields[2] for fields in s] for s in columns]
    scores = entity_scores(gold, predicted, TYPES)
    # ORG correct; MISC missed; Peter Black_burn predicted as two PER entities: 1 of 3.
    assert scores["f1"] == pytest.approx(f1_score(file_gold, file_predicted)) == 1 / 3
    assert scores["precision"] == precision_score(file_gold, file_predicted)
    assert scores["recall"] == recall_score(file_gold, file_predicted)

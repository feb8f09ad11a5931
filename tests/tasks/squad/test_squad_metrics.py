"""The official SQuAD metrics (bertkit.tasks.squad.metrics): normalisation and EM/F1 against
hand-worked examples, the v1.1/v2.0 differences, the HasAns/NoAns breakdown, the best-threshold
search against a brute-force search, the official output files, and the real dev sets."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.squad.files import read_squad_json
from bertkit.tasks.squad.metrics import (
    exact_match,
    f1,
    normalize_answer,
    squad_v1_scores,
    squad_v2_scores,
    write_null_odds_json,
    write_predictions_json,
)
from tests.conftest import real_data_dir


def examples(golds: dict[str, list[str]]) -> list[dict]:
    """Examples in the shared schema (only id and answers are read by the metrics)."""
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}}
            for qid, texts in golds.items()]


# --- normalisation, EM, F1 -----------------------------------------------------------------


@pytest.mark.parametrize(("text", "normalized"), [
    ("The Cat, sat!", "cat sat"),  # lower, punctuation, leading article
    ("An apple a day", "apple day"),
    ("theater anthem", "theater anthem"),  # articles only as whole words
    ("A-team", "ateam"),  # punctuation goes first, so "a" is no longer a word
    ("the.the", "thethe"),
    ("Rock 'n' roll", "rock n roll"),
    ("  several   spaces\tand\nnewlines ", "several spaces and newlines"),
    ("\u201cHi\u201d \u2014 there", "\u201chi\u201d \u2014 there"),  # only ASCII punctuation
    ("the", ""),
    ("", ""),
])
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_after_normalisation():
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1
    assert exact_match("Eiffel Tower", "the Eiffel tower in Paris") == 0
    assert exact_match("1,000", "1000") == 1  # the comma is punctuation


@pytest.mark.parametrize(("prediction", "gold", "expected"), [
    # [cat, sat] vs [cat, sat, down]: P = 2/2 = 1, R = 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    ("the cat sat", "a cat sat down", 0.8),
    # Counter overlap counts a repeated token at most as often as in the other answer:
    # [cat, cat, cat] vs [cat, dog]: 1 common, P = 1/3, R = 1/2, F1 = (1/3) / (5/6) = 0.4
    ("cat cat cat", "cat dog", 0.4),
    # [in, 1990, and, 1991] vs [1990]: P = 1/4, R = 1, F1 = (1/2) / (5/4) = 0.4
    ("in 1990 and 1991", "1990", 0.4),
    ("Denver Broncos", "the Denver Broncos.", 1.0),
    ("Carolina Panthers", "Denver Broncos", 0.0),
    # v2.0: an answer that normalises to nothing scores 1 against another such, 0 otherwise.
    ("", "", 1.0),
    ("a", "the", 1.0),
    ("", "Denver", 0.0),
    ("Denver", "", 0.0),
])
def test_f1_hand_worked(prediction, gold, expected):
    assert f1(prediction, gold) == pytest.approx(expected, abs=1e-12)
    assert f1(gold, prediction) == pytest.approx(expected, abs=1e-12)  # F1 is symmetric


def test_max_over_several_gold_answers():
    golds = {"q": ["1990", "1990 and 1991 seasons", "Nineteen ninety"]}
    # EM 0 against each. F1 against each: 0.4 (above); [in, 1990, and, 1991] vs
    # [1990, and, 1991, seasons]: 3 common, P = R = 3/4, F1 = 0.75; 0. The max is 0.75.
    assert squad_v1_scores({"q": "in 1990 and 1991"}, examples(golds)) == pytest.approx(
        {"exact_match": 0.0, "f1": 75.0})
    # EM takes its own max: the second gold matches after normalisation, the others do not.
    golds = {"q": ["Broncos", "the Denver Broncos", "Denver"]}
    assert squad_v1_scores({"q": "Denver Broncos"}, examples(golds)) == {
        "exact_match": 100.0, "f1": 100.0}


@pytest.mark.parametrize(("prediction", "gold"), [
    ("the cat sat", "a cat sat down"), ("cat cat cat", "cat dog"), ("", "Denver"),
    ("the", "Denver"), ("Denver!", "denver"), ("Broncos", "Denver Broncos"), ("x y z", "a b"),
])
def test_v1_and_v2_agree_when_the_gold_answer_has_tokens(prediction, gold):
    """evaluate-v1.1.py f1_score differs from v2.0's compute_f1 only for empty golds."""
    golds = examples({"q": [gold]})
    v1 = squad_v1_scores({"q": prediction}, golds)
    v2 = squad_v2_scores({"q": prediction}, golds)
    assert v1 == {"exact_match": 100.0 * exact_match(prediction, gold),
                  "f1": 100.0 * f1(prediction, gold)}
    assert (v2["exact"], v2["f1"]) == (v1["exact_match"], v1["f1"])


def test_gold_answer_that_normalises_to_nothing_differs_as_in_the_official_scripts():
    golds = examples({"q": ["The"]})
    # v1.1: EM compares "" with "" (1); f1_score has no common token (0).
    assert squad_v1_scores({"q": "a"}, golds) == {"exact_match": 100.0, "f1": 0.0}
    # v2.0: the gold is dropped, leaving [""]: EM 1 and F1 1 (both empty).
    scores = squad_v2_scores({"q": "a"}, golds)
    assert (scores["exact"], scores["f1"]) == (100.0, 100.0)


def test_v1_missing_prediction_counts_zero(caplog):
    golds = examples({"q1": ["Paris"], "q2": ["Rome"], "q3": ["Oslo"], "q4": ["Bern"]})
    with caplog.at_level(logging.WARNING, logger="bertkit.tasks.squad.metrics"):
        scores = squad_v1_scores({"q1": "Paris", "q2": "Rome", "q4": "bern."}, golds)
    assert scores == {"exact_match": 75.0, "f1": 75.0}  # 3 of 4, not 3 of 3
    assert "1 unanswered questions will receive score 0 (first: q3)" in caplog.text


def test_bad_examples():
    with pytest.raises(BertkitError, match=r"question 'q' has no gold answer.*SQuAD v2\.0"):
        squad_v1_scores({"q": ""}, examples({"q": []}))
    with pytest.raises(BertkitError, match=r"question id 'q' appears twice"):
        squad_v1_scores({"q": ""}, examples({"q": ["a"]}) * 2)
    with pytest.raises(BertkitError, match=r"question 'n' has a prediction but no null odds"):
        squad_v2_scores({"h": "a", "n": ""}, examples({"h": ["a"], "n": []}), {"h": 0.1})


# --- v2.0: HasAns / NoAns, the no-answer threshold, the best threshold -----------------------


V2_GOLDS = {
    "h1": ["Denver Broncos", "Broncos"],
    "h2": ["a cat sat down"],
    "h3": ["Paris"],
    "n1": [],
    "n2": [],
}
V2_PREDICTIONS = {"h1": "the Broncos", "h2": "the cat sat", "h3": "", "n1": "", "n2": "London"}
# Per question, EM / F1: h1 1 / 1 (max over golds), h2 0 / 0.8, h3 0 / 0, n1 1 / 1, n2 0 / 0.


def test_v2_breakdown():
    scores = squad_v2_scores(V2_PREDICTIONS, examples(V2_GOLDS))
    assert scores == pytest.approx({
        "exact": 100 * 2 / 5, "f1": 100 * 2.8 / 5, "total": 5,
        "HasAns_exact": 100 * 1 / 3, "HasAns_f1": 100 * 1.8 / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    })  # no best_* keys without null odds


def test_v2_only_answerable_questions_have_no_noans_keys():
    scores = squad_v2_scores({"h": "x"}, examples({"h": ["x"]}))
    assert scores == {"exact": 100.0, "f1": 100.0, "total": 1,
                      "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 1}


NULL_ODDS = {"h1": -2.0, "h2": 0.5, "h3": 3.0, "n1": 0.0, "n2": 4.0}


def test_v2_null_threshold_and_best_threshold_by_hand():
    scores = squad_v2_scores(V2_PREDICTIONS, examples(V2_GOLDS), NULL_ODDS, null_threshold=1.0)
    # Odds above 1.0 (h3, n2) count as "no answer": h3 -> 0, n2 -> 1.
    # EM: 1 + 0 + 0 + 1 + 1 = 3; F1: 1 + 0.8 + 0 + 1 + 1 = 3.8.
    # Best-threshold sweep, from 2 (the NoAns questions) in rising odds:
    #   h1 (-2.0): EM 3, F1 3 (best for both so far); n1 (0.0): "" predicted, +0;
    #   h2 (0.5): EM 3, F1 3.8 (new best F1); h3 (3.0): +0; n2 (4.0): "London", -1.
    assert scores == pytest.approx({
        "exact": 60.0, "f1": 76.0, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 * 1.8 / 3, "HasAns_total": 3,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
        "best_exact": 60.0, "best_exact_thresh": -2.0,
        "best_f1": 76.0, "best_f1_thresh": 0.5,
    })
    # The default threshold (1.0, as --na-prob-thresh) applies too; odds of 1.0 are not above.
    default = squad_v2_scores(V2_PREDICTIONS, examples(V2_GOLDS), {k: 1.0 for k in NULL_ODDS})
    assert default["exact"] == 40.0


def test_v2_best_threshold_starts_at_zero_when_answering_never_helps():
    golds = examples({"h": ["Paris"], "n": []})
    scores = squad_v2_scores({"h": "Rome", "n": "Oslo"}, golds, {"h": 0.3, "n": 0.7})
    assert (scores["best_exact"], scores["best_exact_thresh"]) == (50.0, 0.0)
    assert (scores["best_f1"], scores["best_f1_thresh"]) == (50.0, 0.0)


def test_v2_missing_prediction_counts_zero_everywhere(caplog):
    predictions = {k: v for k, v in V2_PREDICTIONS.items() if k != "n1"}
    with caplog.at_level(logging.WARNING, logger="bertkit.tasks.squad.metrics"):
        scores = squad_v2_scores(predictions, examples(V2_GOLDS), NULL_ODDS)
    assert "1 unanswered questions will receive score 0 (first: n1)" in caplog.text
    # As above with n1 at 0 (it was 1): EM 2 / 5, F1 2.8 / 5; NoAns 1 of 2.
    # Sweep from 1 (n2 only): h1 +1 -> 2; h2 EM +0, F1 +0.8 -> 2.8; h3 +0; n2 -1.
    assert scores == pytest.approx({
        "exact": 40.0, "f1": 56.0, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 * 1.8 / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        "best_exact": 40.0, "best_exact_thresh": -2.0,
        "best_f1": 56.0, "best_f1_thresh": 0.5,
    })


def random_v2_set(seed: int, n: int = 300):
    """Random gold answers, predictions (exact, partial, wrong or empty) and null odds."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(20)]
    golds, predictions, null_odds = {}, {}, {}
    for i in range(n):
        qid = f"q{i}"
        if rng.random() < 0.5:
            gold = " ".join(rng.choice(words, size=rng.integers(1, 5)))
            golds[qid] = [gold, " ".join(gold.split()[:1])]
            kind = rng.integers(4)
            predictions[qid] = [gold, gold.split()[0] + " w99",
                                " ".join(rng.choice(words, size=2)), ""][kind]
        else:
            golds[qid] = []
            predictions[qid] = "" if rng.random() < 0.5 else str(rng.choice(words))
        null_odds[qid] = float(rng.random())  # in [0, 1): the sweep's start 0.0 is below all
    return golds, predictions, null_odds


def brute_force_best(golds, predictions, null_odds, metric):
    """Try every threshold: below all odds, each distinct odds value, above all odds.
    A question counts as "no answer" when its odds are above the threshold."""
    values = sorted(set(null_odds.values()))
    candidates = [values[0] - 1.0, *values, values[-1] + 1.0]
    best_score, best_threshold = -1.0, None
    for threshold in candidates:
        total = 0.0
        for qid, texts in golds.items():
            if null_odds[qid] > threshold:
                total += float(not texts)
            else:
                total += max(metric(predictions[qid], gold) for gold in texts or [""])
        if total > best_score + 1e-9:  # the lowest threshold that reaches the best
            best_score, best_threshold = total, threshold
    # The official sweep reports 0.0 for "every question no answer" (below all odds here).
    return 100.0 * best_score / len(golds), (0.0 if best_threshold < values[0]
                                             else best_threshold)


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_equals_brute_force(seed):
    golds, predictions, null_odds = random_v2_set(seed)
    scores = squad_v2_scores(predictions, examples(golds), null_odds)
    for name, metric in (("exact", exact_match), ("f1", f1)):
        best, threshold = brute_force_best(golds, predictions, null_odds, metric)
        assert scores[f"best_{name}"] == pytest.approx(best, rel=1e-12)
        assert scores[f"best_{name}_thresh"] == threshold
        # Applying the reported threshold as --na-prob-thresh gives the reported best score.
        again = squad_v2_scores(predictions, examples(golds), null_odds, null_threshold=threshold)
        assert again[name] == pytest.approx(scores[f"best_{name}"], rel=1e-12)


# --- files in the official formats ---------------------------------------------------------


def test_prediction_and_null_odds_files(tmp_path):
    predictions = {"q1": "Denver Broncos", "q0": "", "q2": "caf\u00e9 \u201cx\u201d"}
    null_odds = {"q1": np.float32(-1.5), "q0": 2.25, "q2": np.float64(0.125)}
    path = write_predictions_json(tmp_path / "out" / "predictions.json", predictions)
    assert path == tmp_path / "out" / "predictions.json"
    assert json.loads(path.read_text(encoding="utf-8")) == predictions
    assert list(json.loads(path.read_text(encoding="utf-8"))) == ["q1", "q0", "q2"]
    path = write_null_odds_json(tmp_path / "out" / "null_odds.json", null_odds)
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": -1.5, "q0": 2.25, "q2": 0.125}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "null_odds.json", "predictions.json"]  # no temporary files left


# --- the real dev sets ---------------------------------------------------------------------


@pytest.mark.real_data
def test_real_dev_v1_gold_predictions_score_100():
    table = read_squad_json(real_data_dir() / "squad" / "dev-v1.1.json", version="v1.1")
    first_answers = [answers["text"][0] for answers in table["answers"]]
    predictions = dict(zip(table["id"], first_answers, strict=True))
    assert len(predictions) == 10570
    assert squad_v1_scores(predictions, table) == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.real_data
def test_real_dev_v2_empty_predictions():
    table = read_squad_json(real_data_dir() / "squad" / "dev-v2.0.reconstructed.json",
                            version="v2.0")
    scores = squad_v2_scores({qid: "" for qid in table["id"]}, table)
    assert scores == {
        "exact": 100.0 * 5945 / 11873, "f1": 100.0 * 5945 / 11873, "total": 11873,
        "HasAns_exact": 0.0, "HasAns_f1": 0.0, "HasAns_total": 5928,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 5945,
    }
    # Gold as prediction: the first answer, or "" for an unanswerable question.
    gold = dict(zip(table["id"], [(a["text"] or [""])[0] for a in table["answers"]], strict=True))
    assert squad_v2_scores(gold, table)["exact"] == 100.0

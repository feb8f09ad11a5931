"""The official SQuAD evaluation (evaluate-v1.1.py, evaluate-v2.0.py), computed offline.

Why a copy and not `evaluate.load("squad")`: that fetches its script from the Hub, which fails
offline, and the numbers must be the official scripts' to the last digit, quirks included, so
that predictions.json / null_odds.json written here give the same numbers when fed to them.

One deliberate difference: a question without a prediction scores 0 and stays in every
denominator. evaluate-v1.1.py does this ("Unanswered question ... will receive score 0");
evaluate-v2.0.py skips it from the total, or fails with a KeyError in the HasAns/NoAns split.
"""

from __future__ import annotations

import collections
import logging
import re
import string
from collections.abc import Iterable, Mapping
from pathlib import Path

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, drop ASCII punctuation, the articles a/an/the, and extra white space."""
    # translate() removes exactly the characters the official set(string.punctuation) does.
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_NO_PUNCTUATION)).split())


def _tokens(s: str) -> list[str]:
    # evaluate-v2.0.py get_tokens.
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token F1 of evaluate-v2.0.py (compute_f1): an empty answer (no tokens after
    normalisation) scores 1 against an empty one and 0 against any other. For a gold answer
    with tokens this equals evaluate-v1.1.py's f1_score."""
    gold_tokens, pred_tokens = _tokens(gold), _tokens(prediction)
    if not gold_tokens or not pred_tokens:
        return int(gold_tokens == pred_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _max_scores(prediction: str, golds: list[str], v1: bool) -> tuple[int, float]:
    """(EM, F1) of one prediction, each the max over the gold answers; each answer normalised
    once. v1: evaluate-v1.1.py's f1_score, where two empty answers score 0, not 1."""
    prediction = normalize_answer(prediction)
    pred_tokens = prediction.split()
    best_exact, best_f1 = 0, 0
    for gold in golds:
        gold = normalize_answer(gold)
        gold_tokens = gold.split()
        best_exact = max(best_exact, int(prediction == gold))
        if v1 or (gold_tokens and pred_tokens):
            score = _overlap_f1(pred_tokens, gold_tokens)
        else:
            score = int(gold_tokens == pred_tokens)
        best_f1 = max(best_f1, score)
    return best_exact, best_f1


def _gold_texts(examples) -> dict[str, list[str]]:
    """Question id -> gold answer texts, in example order, from a Dataset in the shared
    schema (read by column: fast) or any iterable of {"id", "answers": {"text"}} mappings."""
    if hasattr(examples, "column_names"):
        columns = examples.select_columns(["id", "answers"]).to_dict()
        pairs = zip(columns["id"], (answers["text"] for answers in columns["answers"]),
                    strict=True)
    else:
        pairs = ((example["id"], example["answers"]["text"]) for example in examples)
    golds: dict[str, list[str]] = {}
    for qid, texts in pairs:
        if qid in golds:
            raise BertkitError(f"SQuAD examples: question id {qid!r} appears twice")
        golds[qid] = list(texts)
    if not golds:
        raise BertkitError("SQuAD examples: no questions to evaluate")
    return golds


def _warn_unanswered(missing: list[str]) -> None:
    if missing:
        logger.warning("%d unanswered questions will receive score 0 (first: %s)",
                       len(missing), ", ".join(missing[:5]))


def squad_v1_scores(predictions: Mapping[str, str], examples: Iterable) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent, max over the gold answers."""
    golds = _gold_texts(examples)
    exact_total = f1_total = 0.0
    missing = []
    for qid, texts in golds.items():
        if not texts:
            raise BertkitError(
                f"SQuAD v1.1 evaluation: question {qid!r} has no gold answer (unanswerable "
                f"questions are SQuAD v2.0: use its evaluation)"
            )
        if qid not in predictions:
            missing.append(qid)
            continue
        exact, f1_score = _max_scores(predictions[qid], texts, v1=True)
        exact_total += exact
        f1_total += f1_score
    _warn_unanswered(missing)
    return {"exact_match": 100.0 * exact_total / len(golds), "f1": 100.0 * f1_total / len(golds)}


def _best_threshold(predictions, scores, null_odds, has_answer) -> tuple[float, float]:
    """evaluate-v2.0.py find_best_thresh, as (number of points, threshold): start from "every
    question answered with no answer" (the NoAns count), then answer questions in order of
    rising null odds and keep the best.

    Quirks kept: the best threshold starts at 0.0; a NoAns question loses 1 whenever its
    prediction is a non-empty string, whatever its score; equal odds are swept one question
    at a time, in the order of null_odds.
    """
    current = best = sum(1 for qid in has_answer if not has_answer[qid])
    best_threshold = 0.0
    for qid in sorted(null_odds, key=lambda k: null_odds[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        current += diff
        if current > best:
            best = current
            best_threshold = null_odds[qid]
    return best, best_threshold


def squad_v2_scores(
    predictions: Mapping[str, str],
    examples: Iterable,
    null_odds: Mapping[str, float] | None = None,
    null_threshold: float = 1.0,
) -> dict[str, float | int]:
    """evaluate-v2.0.py with its --na-prob-file (null_odds) and --na-prob-thresh
    (null_threshold): a question whose null odds exceed the threshold counts as answered with
    no answer. Keys: exact, f1, total, HasAns_* and NoAns_* (each only where the set has such
    questions, as the official script does) and, with null_odds, best_exact(_thresh) and
    best_f1(_thresh), the scores at the threshold that maximises each on these examples."""
    golds = _gold_texts(examples)
    has_answer = {qid: bool(texts) for qid, texts in golds.items()}
    odds = null_odds if null_odds is not None else {qid: 0.0 for qid in predictions}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    missing = []
    for qid, texts in golds.items():
        if qid not in predictions:
            missing.append(qid)
            continue
        if qid not in odds:
            raise BertkitError(f"SQuAD v2.0 evaluation: question {qid!r} has a prediction but "
                               f"no null odds")
        # Gold answers that normalise to nothing are dropped; none left means unanswerable.
        texts = [text for text in texts if normalize_answer(text)] or [""]
        exact_raw[qid], f1_raw[qid] = _max_scores(predictions[qid], texts, v1=False)
    _warn_unanswered(missing)

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        scores = {qid: 0.0 for qid in golds}  # unanswered questions stay at 0
        for qid, score in raw.items():
            no_answer = odds[qid] > null_threshold
            scores[qid] = float(not has_answer[qid]) if no_answer else score
        return scores

    exact, f1_scores = thresholded(exact_raw), thresholded(f1_raw)
    out: dict[str, float | int] = {
        "exact": 100.0 * sum(exact.values()) / len(golds),
        "f1": 100.0 * sum(f1_scores.values()) / len(golds),
        "total": len(golds),
    }
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in golds if has_answer[qid] is wanted]
        if qids:
            out[f"{prefix}_exact"] = 100.0 * sum(exact[qid] for qid in qids) / len(qids)
            out[f"{prefix}_f1"] = 100.0 * sum(f1_scores[qid] for qid in qids) / len(qids)
            out[f"{prefix}_total"] = len(qids)
    if null_odds is not None:
        # Unanswered questions count in the denominator and never score (the official script
        # has none: there the sweep covers every question and the two agree).
        answered = {qid: has_answer[qid] for qid in exact_raw}
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            points, threshold = _best_threshold(predictions, raw, null_odds, answered)
            out[f"best_{name}"] = 100.0 * points / len(golds)
            out[f"best_{name}_thresh"] = threshold
    return out


def write_predictions_json(path: str | Path, predictions: Mapping[str, str]) -> Path:
    """predictions.json as the official scripts read it: question id -> answer text."""
    return write_json_atomic(path, {str(qid): str(text) for qid, text in predictions.items()})


def write_null_odds_json(path: str | Path, null_odds: Mapping[str, float]) -> Path:
    """null_odds.json, evaluate-v2.0.py's --na-prob-file: question id -> null odds (float)."""
    return write_json_atomic(path, {str(qid): float(odds) for qid, odds in null_odds.items()})

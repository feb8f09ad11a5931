"""Span decoding (bertkit.tasks.squad.decoding): oracle logits built from the gold answers decode
back to the gold texts on generated long passages (v1.1 and v2.0), the best span across
windows, the spans that are never valid (in the question, end before start, too long, start
outside its max-context window, past the window), the v2.0 null threshold and null odds with
fixed numbers, n-best lists, and the real dev sets: v1.1 (timed) and the reconstructed v2.0."""

from __future__ import annotations

import time

import datasets
import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertkit.errors import BertkitError
from bertkit.tasks.squad.decoding import decode_predictions
from bertkit.tasks.squad.features import evaluation_features, train_features
from bertkit.tasks.squad.files import FEATURES, read_squad_json
from bertkit.tasks.squad.metrics import normalize_answer, squad_v1_scores, squad_v2_scores
from tests.conftest import real_data_dir
from tests.tasks.squad.test_squad_features import SETTINGS, WORDS, make_examples, make_tokenizer

LOW, HIGH = -10.0, 10.0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> BertTokenizerFast:
    return make_tokenizer(tmp_path_factory.mktemp("squad-vocab"))


def oracle_logits(train: datasets.Dataset, width: int | None = None):
    """What a perfect model trained on these windows outputs: HIGH at the labelled start and
    end ([CLS] where the window lacks the answer), LOW elsewhere."""
    width = width or max(len(ids) for ids in train["input_ids"])
    start = np.full((len(train), width), LOW, dtype=np.float32)
    end = start.copy()
    rows = np.arange(len(train))
    start[rows, np.array(train["start_positions"])] = HIGH
    end[rows, np.array(train["end_positions"])] = HIGH
    return start, end


@pytest.mark.parametrize("version_2", [False, True])
def test_oracle_round_trip_gives_the_gold_texts(tokenizer, version_2):
    examples = make_examples(40, seed=1, unanswerable=0.3 if version_2 else 0.0)
    train = train_features(examples, tokenizer, **SETTINGS)
    features = evaluation_features(examples, tokenizer, **SETTINGS)
    assert len(features) > 4 * len(examples)
    start, end = oracle_logits(train)
    out = decode_predictions(examples, features, start, end, version_2=version_2)
    gold = {e["id"]: (e["answers"]["text"] or [""])[0] for e in examples}
    assert out.predictions == gold  # exactly the original characters
    if version_2:
        assert out.null_odds.keys() == gold.keys()
        for qid, text in gold.items():
            # answerable: min null is a window without [CLS] high (2 LOW), best 2 HIGH
            assert out.null_odds[qid] == (4 * HIGH if not text else 4 * LOW)
        scores = squad_v2_scores(out.predictions, examples, out.null_odds)
        assert scores["exact"] == 100.0 and scores["NoAns_total"] > 0
    else:
        assert out.null_odds is None
        assert squad_v1_scores(out.predictions, examples)["exact_match"] == 100.0


def long_example(tokenizer, question: str = "baka?"):
    """One question over 100 distinct one-token words: with the question's 2 tokens a window
    holds 59 passage tokens, so windows start at passage tokens 0, 16, 32 and 48."""
    context = " ".join(WORDS[:100])
    examples = datasets.Dataset.from_dict({
        "id": ["q"], "title": ["t"], "context": [context], "question": [question],
        "answers": [{"text": [WORDS[0]], "answer_start": [0]}],
    }, features=FEATURES)
    features = evaluation_features(examples, tokenizer, **SETTINGS)
    return examples, features


def position(features, window: int, word: int) -> int:
    """Index of passage word `word` (one token each) in window `window`."""
    start = " ".join(WORDS[:word]) + (" " if word else "")
    offsets = features[window]["offset_mapping"]
    return next(j for j, o in enumerate(offsets) if o is not None and o[0] == len(start))


def is_max_context(features, window: int, word: int) -> bool:
    return features[window]["token_is_max_context"][position(features, window, word)]


def blank(features, fill: float = LOW):
    width = max(len(ids) for ids in features["input_ids"])
    return np.full((len(features), width), fill, np.float32), np.full(
        (len(features), width), fill, np.float32)


def span(first: int, last: int) -> str:
    return " ".join(WORDS[first:last + 1])


def test_the_best_span_across_windows_wins(tokenizer):
    examples, features = long_example(tokenizer)
    assert len(features) == 4
    assert is_max_context(features, 0, 5) and is_max_context(features, 2, 60)
    for a, b, expected in ((3.0, 4.0, span(60, 61)), (4.0, 3.0, span(5, 6))):
        start, end = blank(features)
        start[0, position(features, 0, 5)] = end[0, position(features, 0, 6)] = a
        start[2, position(features, 2, 60)] = end[2, position(features, 2, 61)] = b
        out = decode_predictions(examples, features, start, end, version_2=False)
        assert out.predictions == {"q": expected}


def test_spans_in_the_question_before_their_start_or_past_the_window_are_skipped(tokenizer):
    examples, features = long_example(tokenizer, question="baka bake biki?")
    start, end = blank(features, 0.0)
    first = position(features, 0, 0)
    start[0, :first] = end[0, :first] = 50.0  # [CLS], question and [SEP]
    start[0, first + 10] = 9.0
    end[0, first + 5] = 9.0  # (10, 5) would score 18 but ends before it starts
    start[0, first + 5] = 3.0  # (5, 5) scores 12: the best valid span
    end[0, first + 7] = 3.0
    start[:, -1] = end[:, -1] = 99.0  # the final [SEP] of full windows
    padded = [np.pad(a, ((0, 0), (0, 8)), constant_values=100.0) for a in (start, end)]
    for logits in ((start, end), padded):
        out = decode_predictions(examples, features, *logits, version_2=False)
        assert out.predictions == {"q": WORDS[5]}


def test_max_answer_length_is_honoured(tokenizer):
    examples, features = long_example(tokenizer)
    start, end = blank(features)
    p = position(features, 0, 10)
    start[0, p] = 5.0
    end[0, p + 5] = 5.0  # 6 tokens long
    end[0, p + 1] = 1.0  # 2 tokens long, lower
    assert decode_predictions(examples, features, start, end, version_2=False,
                              max_answer_length=6).predictions["q"] == span(10, 15)
    assert decode_predictions(examples, features, start, end, version_2=False,
                              max_answer_length=5).predictions["q"] == span(10, 11)


def test_a_span_may_only_start_in_its_max_context_window(tokenizer):
    examples, features = long_example(tokenizer)
    # Word 20 is in windows 0 (20 tokens of left context) and 1 (4): window 0 owns it.
    assert is_max_context(features, 0, 20) and not is_max_context(features, 1, 20)
    assert is_max_context(features, 1, 45)
    start, end = blank(features)
    start[1, position(features, 1, 20)] = end[1, position(features, 1, 20)] = HIGH
    start[1, position(features, 1, 45)] = end[1, position(features, 1, 45)] = 1.0
    out = decode_predictions(examples, features, start, end, version_2=False)
    assert out.predictions == {"q": WORDS[45]}
    start[0, position(features, 0, 20)] = end[0, position(features, 0, 20)] = HIGH
    out = decode_predictions(examples, features, start, end, version_2=False)
    assert out.predictions == {"q": WORDS[20]}


def null_case(tokenizer):
    """Best span 3 + 2 = 5 (word 10, window 0); [CLS] sums 4, 8, 6, 10: the null score is
    their minimum, 4, so null - best = -1."""
    examples, features = long_example(tokenizer)
    start, end = blank(features, -5.0)
    p = position(features, 0, 10)
    start[0, p], end[0, p] = 3.0, 2.0
    start[:, 0] = end[:, 0] = np.array([2.0, 4.0, 3.0, 5.0])
    return examples, features, start, end


@pytest.mark.parametrize(("threshold", "expected"), [
    (-1.5, ""), (-1.0, WORDS[10]), (-0.5, WORDS[10]), (0.0, WORDS[10])])
def test_v2_null_wins_exactly_above_the_threshold(tokenizer, threshold, expected):
    examples, features, start, end = null_case(tokenizer)
    out = decode_predictions(examples, features, start, end, version_2=True,
                             null_score_diff_threshold=threshold)
    assert out.predictions == {"q": expected}
    assert out.null_odds == {"q": -1.0}


def test_v1_ignores_the_null_score(tokenizer):
    examples, features, start, end = null_case(tokenizer)
    start[:, 0] = end[:, 0] = 100.0
    assert decode_predictions(examples, features, start, end,
                              version_2=False).predictions == {"q": WORDS[10]}


def test_nbest_lists(tokenizer):
    examples, features, start, end = null_case(tokenizer)
    start[0, position(features, 0, 12)] = 1.0
    end[0, position(features, 0, 13)] = 0.5
    out = decode_predictions(examples, features, start, end, version_2=True, n_best_size=2,
                             with_nbest=True)
    # the 2 best spans of window 0's top-2 starts (words 10, 12) x top-2 ends (10, 13):
    # (10, 10) = 5, (10, 13) = 3.5, (12, 13) = 1.5; plus the null entry (2 + 2), by score
    entries = out.nbest["q"]
    assert [entry["text"] for entry in entries] == [WORDS[10], "", span(10, 13)]
    totals = np.array([entry["start_logit"] + entry["end_logit"] for entry in entries])
    assert totals.tolist() == [5.0, 4.0, 3.5]
    expected = np.exp(totals) / np.exp(totals).sum()
    assert [entry["probability"] for entry in entries] == pytest.approx(expected.tolist())
    v1 = decode_predictions(examples, features, start, end, version_2=False, with_nbest=True)
    texts = [entry["text"] for entry in v1.nbest["q"]]
    assert texts[0] == v1.predictions["q"] and len(set(texts)) == len(texts) == 20


def test_mismatched_inputs_raise(tokenizer):
    examples, features = long_example(tokenizer)
    start, end = blank(features)
    with pytest.raises(BertkitError, match="rows"):
        decode_predictions(examples, features, start[:2], end[:2], version_2=False)
    with pytest.raises(BertkitError, match="same shape"):
        decode_predictions(examples, features, start, end[:, :5], version_2=False)
    with pytest.raises(BertkitError, match="positions wide"):
        decode_predictions(examples, features, start[:, :10], end[:, :10], version_2=False)
    other = examples.map(lambda row: {"id": "other"})
    with pytest.raises(BertkitError, match="'q' is not among the examples"):
        decode_predictions(other, features, start, end, version_2=False)
    with pytest.raises(BertkitError, match="offset_mapping"):
        decode_predictions(examples, features.remove_columns("offset_mapping"), start, end,
                           version_2=False)


@pytest.mark.slow
@pytest.mark.real_data
def test_real_dev_v1_oracle_round_trip_and_decoding_time():
    data = real_data_dir()
    tokenizer = BertTokenizerFast.from_pretrained(str(data / "vocab" / "bert-base-uncased"))
    examples = read_squad_json(data / "squad" / "dev-v1.1.json", version="v1.1")
    # A real tokeniser is fingerprinted by datasets: no caching needed across tests here.
    train = train_features(examples, tokenizer, max_seq_length=384, doc_stride=128)
    features = evaluation_features(examples, tokenizer, max_seq_length=384, doc_stride=128)
    assert train["input_ids"] == features["input_ids"]
    start, end = oracle_logits(train, width=384)

    began = time.perf_counter()
    out = decode_predictions(examples, features, start, end, version_2=False)
    seconds = time.perf_counter() - began
    print(f"\ndecoded {len(examples)} questions, {len(features)} windows of <= 384 tokens "
          f"in {seconds:.2f} s")  # shown, not asserted: a loaded machine is slow

    # An answer whose first or last character is inside a WordPiece token ("gold" in
    # "golden") cannot be cut out of whole tokens; every other one comes back exactly, once
    # answers longer than max_answer_length (30 tokens) are allowed.
    out_long = decode_predictions(examples, features, start, end, version_2=False,
                                  max_answer_length=384)
    contexts = list(examples["context"])
    token_offsets = tokenizer(contexts, add_special_tokens=False,
                              return_offsets_mapping=True)["offset_mapping"]
    aligned, missed = 0, []
    for qid, answers, offsets in zip(examples["id"], examples["answers"], token_offsets,
                                     strict=True):
        text, first = answers["text"][0], answers["answer_start"][0]
        first += len(text) - len(text.lstrip())
        last = first + len(text.strip())
        if first in {o[0] for o in offsets} and last in {o[1] for o in offsets}:
            aligned += 1
            if normalize_answer(out_long.predictions[qid]) != normalize_answer(text):
                missed.append((qid, text, out_long.predictions[qid]))
    assert missed == []
    exact = squad_v1_scores(out.predictions, examples)["exact_match"]
    print(f"oracle EM {exact:.2f} (max_answer_length 30); {aligned} of {len(examples)} first "
          f"gold answers start and end on token boundaries, all decoded exactly")
    assert len(examples) - aligned < 50 and exact > 99.5


@pytest.mark.slow
@pytest.mark.real_data
def test_real_dev_v2_oracle_round_trip():
    data = real_data_dir()
    tokenizer = BertTokenizerFast.from_pretrained(str(data / "vocab" / "bert-base-uncased"))
    examples = read_squad_json(data / "squad" / "dev-v2.0.reconstructed.json", version="v2.0")
    train = train_features(examples, tokenizer)
    features = evaluation_features(examples, tokenizer)
    start, end = oracle_logits(train, width=384)
    out = decode_predictions(examples, features, start, end, version_2=True,
                             max_answer_length=384)
    scores = squad_v2_scores(out.predictions, examples, out.null_odds)
    print(f"\nv2.0 oracle: {len(features)} windows, {scores}")
    assert scores["NoAns_exact"] == 100.0 and scores["HasAns_exact"] > 99.5
    for answers, qid in zip(examples["answers"], examples["id"], strict=True):
        assert (out.null_odds[qid] > 0) == (not answers["text"])

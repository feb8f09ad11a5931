"""SQuAD windows (bertkit.tasks.squad.features) on generated examples whose passages (~200 tokens)
need several 64-token windows: coverage and Google's doc_stride step, question truncation,
answer token positions, [CLS] for windows without the answer and for unanswerable questions,
max-context flags against a port of Google's check, and the settings errors.

The generators here are shared with tests/tasks/squad/test_squad_decoding.py."""

from __future__ import annotations

import random
from pathlib import Path

import datasets
import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.tasks.squad.features import (
    check_window_settings,
    evaluation_features,
    max_context_flags,
    train_features,
    truncate_questions,
)
from bertkit.tasks.squad.files import FEATURES
from tests.conftest import compose_config

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
# Whole words of two syllables; "##ing" and "##s" make suffixed words split into two tokens.
WORDS = sorted({a + b for a in SYLLABLES[:20] for b in SYLLABLES[20:32]})
SETTINGS = {"max_seq_length": 64, "doc_stride": 16, "max_query_length": 12}


def write_vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "##ing", "##s"]
    (directory / "vocab.txt").write_text("\n".join(tokens + WORDS) + "\n")
    return directory


def make_tokenizer(directory: Path) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(str(write_vocab(directory)))


def make_passage(rng: random.Random, n_words: int) -> tuple[str, list[tuple[int, int]]]:
    """A passage and the character span of each word (punctuation excluded)."""
    text, spans = "", []
    for i in range(n_words):
        if i:
            text += " "
        word = rng.choice(WORDS) + rng.choice(["", "", "", "ing", "s"])
        spans.append((len(text), len(text) + len(word)))
        text += word
        if rng.random() < 0.1:
            text += rng.choice([".", ","])
    return text, spans


def make_examples(n: int, seed: int = 0, unanswerable: float = 0.0) -> datasets.Dataset:
    """SQuAD-schema examples with long passages (120-170 words, ~150-250 tokens), answers of
    1-4 words anywhere in them, and questions of 3-20 words (some over max_query_length)."""
    rng = random.Random(seed)
    rows = {name: [] for name in FEATURES}
    for i in range(n):
        context, spans = make_passage(rng, rng.randint(120, 170))
        question = " ".join(rng.choices(WORDS, k=rng.randint(3, 20))) + "?"
        if rng.random() < unanswerable:
            answers = {"text": [], "answer_start": []}
        else:
            first = rng.randrange(len(spans) - 4)
            start, end = spans[first][0], spans[first + rng.randint(0, 3)][1]
            answers = {"text": [context[start:end]], "answer_start": [start]}
        rows["id"].append(f"q{i}")
        rows["title"].append("generated")
        rows["context"].append(context)
        rows["question"].append(question)
        rows["answers"].append(answers)
    return datasets.Dataset.from_dict(rows, features=FEATURES)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> BertTokenizerFast:
    return make_tokenizer(tmp_path_factory.mktemp("squad-vocab"))


@pytest.fixture(scope="module")
def examples() -> datasets.Dataset:
    return make_examples(30, unanswerable=0.2)


@pytest.fixture(scope="module")
def windows(examples, tokenizer):
    return (train_features(examples, tokenizer, **SETTINGS),
            evaluation_features(examples, tokenizer, **SETTINGS))


def passage_tokens(encoding_offsets: list) -> list[tuple[int, int]]:
    return [tuple(o) for o in encoding_offsets if o is not None]


def test_columns_and_same_windows_for_training_and_evaluation(windows):
    train, evaluation = windows
    assert train.column_names == ["input_ids", "token_type_ids", "attention_mask",
                                  "start_positions", "end_positions", "length"]
    assert train["length"] == [len(ids) for ids in train["input_ids"]]
    assert evaluation.column_names == ["input_ids", "token_type_ids", "attention_mask",
                                       "example_id", "offset_mapping", "token_is_max_context"]
    assert train["input_ids"] == evaluation["input_ids"]
    assert len(train) > 3 * 30  # the passages do need several windows


def test_windows_cover_the_passage_and_start_doc_stride_apart(examples, windows, tokenizer):
    evaluation = windows[1]
    rows = evaluation.to_dict()
    for example in examples:
        doc = tokenizer(example["context"], add_special_tokens=False, return_offsets_mapping=True)
        doc_offsets = [tuple(o) for o in doc["offset_mapping"]]
        indices = [i for i, qid in enumerate(rows["example_id"]) if qid == example["id"]]
        covered = set()
        for k, i in enumerate(indices):
            ids, offsets = rows["input_ids"][i], rows["offset_mapping"][i]
            assert len(ids) <= SETTINGS["max_seq_length"]
            first = next(j for j, o in enumerate(offsets) if o is not None)
            question_length = first - 2  # [CLS] question [SEP]
            room = SETTINGS["max_seq_length"] - 3 - question_length
            start = doc_offsets.index(tuple(offsets[first]))
            assert start == k * SETTINGS["doc_stride"]  # Google's doc_stride: the step
            tokens = passage_tokens(offsets)
            assert len(tokens) == min(room, len(doc_offsets) - start)
            assert tokens == doc_offsets[start:start + len(tokens)]
            assert ids[first:first + len(tokens)] == doc["input_ids"][start:start + len(tokens)]
            assert ids[0] == tokenizer.cls_token_id and ids[first - 1] == tokenizer.sep_token_id
            assert ids[-1] == tokenizer.sep_token_id and len(ids) == first + len(tokens) + 1
            covered.update(range(start, start + len(tokens)))
        assert covered == set(range(len(doc_offsets)))


def test_question_keeps_its_first_max_query_length_tokens(examples, windows, tokenizer):
    rows = windows[1].to_dict()
    first_window = {}
    for i, qid in enumerate(rows["example_id"]):
        first_window.setdefault(qid, i)
    n_cut = 0
    for example in examples:
        full = tokenizer(example["question"], add_special_tokens=False)["input_ids"]
        i = first_window[example["id"]]
        question = [t for t, kind, offset in zip(rows["input_ids"][i], rows["token_type_ids"][i],
                                                 rows["offset_mapping"][i], strict=True)
                    if kind == 0 and offset is None][1:-1]  # without [CLS] and [SEP]
        assert question == full[:SETTINGS["max_query_length"]]
        n_cut += len(full) > SETTINGS["max_query_length"]
    assert n_cut > 0


def test_truncate_questions_cuts_at_a_token_end(tokenizer):
    texts, lengths = truncate_questions(["  baka bakaing, bakas?", "baka"], tokenizer, 3)
    assert texts == ["  baka bakaing", "baka"]  # baka bap ##ing | , bap ##s ?
    assert lengths == [3, 1]


def test_start_and_end_positions_point_at_the_answer(examples, windows, tokenizer):
    train, evaluation = windows
    rows = evaluation.to_dict()
    found = set()
    for i, (start, end) in enumerate(zip(train["start_positions"], train["end_positions"],
                                         strict=True)):
        example = examples[int(rows["example_id"][i][1:])]
        offsets = rows["offset_mapping"][i]
        tokens = passage_tokens(offsets)
        answers = example["answers"]
        if not answers["text"]:
            assert (start, end) == (0, 0)
            continue
        answer_start = answers["answer_start"][0]
        answer_end = answer_start + len(answers["text"][0])
        holds = tokens[0][0] <= answer_start and answer_end <= tokens[-1][1]
        if not holds:
            assert (start, end) == (0, 0)
            continue
        found.add(example["id"])
        assert 0 < start <= end
        assert example["context"][offsets[start][0]:offsets[end][1]] == answers["text"][0]
        decoded = tokenizer.decode(rows["input_ids"][i][start:end + 1])
        assert "".join(decoded.replace("##", "").split()) == "".join(answers["text"][0].split())
    assert found == {e["id"] for e in examples if e["answers"]["text"]}


def test_unanswerable_and_answer_outside_the_window_point_at_cls(tokenizer):
    context = " ".join(WORDS[:100])
    start = context.index(WORDS[90])
    examples = datasets.Dataset.from_dict({
        "id": ["none", "late"], "title": ["t", "t"], "context": [context, context],
        "question": ["baka?", "baka?"],
        "answers": [{"text": [], "answer_start": []},
                    {"text": [WORDS[90]], "answer_start": [start]}],
    }, features=FEATURES)
    train = train_features(examples, tokenizer, **SETTINGS)
    evaluation = evaluation_features(examples, tokenizer, **SETTINGS)
    positions = list(zip(train["start_positions"], train["end_positions"], strict=True))
    owners = list(evaluation["example_id"])
    assert all(p == (0, 0) for p, qid in zip(positions, owners, strict=True) if qid == "none")
    late = [p for p, qid in zip(positions, owners, strict=True) if qid == "late"]
    # Question "baka ?" leaves 59 passage tokens: windows start at 0, 16, 32, 48; only the
    # last two reach token 90.
    assert len(late) == 4 and late[:2] == [(0, 0), (0, 0)]
    assert all(p[0] == p[1] == 4 + 90 - window * 16 for window, p in enumerate(late) if p[0])


def test_answer_with_surrounding_white_space_and_inside_a_word(tokenizer):
    context = "baka bakaing bakas"
    examples = datasets.Dataset.from_dict({
        "id": ["space", "inside"], "title": ["t", "t"], "context": [context] * 2,
        "question": ["baka?"] * 2,
        "answers": [{"text": [" bakaing "], "answer_start": [4]},
                    {"text": ["ing"], "answer_start": [9]}],
    }, features=FEATURES)
    train = train_features(examples, tokenizer, **SETTINGS)
    # [CLS] baka ? [SEP] baka baka ##ing baka ##s [SEP]
    assert list(zip(train["start_positions"], train["end_positions"], strict=True)) == [
        (5, 6), (6, 6)]


def google_is_max_context(spans: list[tuple[int, int]], current: int, position: int) -> bool:
    """Google run_squad.py _check_is_max_context, verbatim apart from names."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return current == best_index


@pytest.mark.parametrize("seed", range(5))
def test_max_context_flags_match_google(seed):
    rng = random.Random(seed)
    doc_length, room, stride = rng.randint(60, 300), rng.randint(20, 50), rng.randint(5, 19)
    spans, start = [], 0
    while True:
        length = min(room, doc_length - start)
        spans.append((start, length))
        if start + length == doc_length:
            break
        start += stride
    flags = max_context_flags([s for s, _ in spans], [n for _, n in spans])
    for index, (start, length) in enumerate(spans):
        expected = [google_is_max_context(spans, index, p) for p in range(start, start + length)]
        assert flags[index].tolist() == expected


def test_every_passage_token_has_exactly_one_max_context_window(examples, windows, tokenizer):
    rows = windows[1].to_dict()
    count: dict[tuple[str, tuple[int, int]], int] = {}
    for qid, offsets, flags in zip(rows["example_id"], rows["offset_mapping"],
                                   rows["token_is_max_context"], strict=True):
        for offset, flag in zip(offsets, flags, strict=True):
            assert not (flag and offset is None)  # only passage tokens are flagged
            if offset is not None:
                key = (qid, tuple(offset))
                count[key] = count.get(key, 0) + flag
    assert set(count.values()) == {1}


def test_offsets_are_none_outside_the_passage(windows):
    rows = windows[1].to_dict()
    for ids, types, offsets in zip(rows["input_ids"], rows["token_type_ids"],
                                   rows["offset_mapping"], strict=True):
        passage = [offset is not None for offset in offsets]
        assert passage == [kind == 1 for kind in types[:-1]] + [False]
        assert len(offsets) == len(ids)


@pytest.mark.parametrize(("settings", "keys"), [
    ({"max_seq_length": 64, "max_query_length": 64}, ["task.max_seq_length",
                                                       "task.max_query_length"]),
    ({"max_seq_length": 64, "max_query_length": 12, "doc_stride": 49}, ["task.doc_stride"]),
])
def test_bad_window_settings(settings, keys, examples, tokenizer):
    merged = {**SETTINGS, **settings}
    for build in (train_features, evaluation_features):
        with pytest.raises(BertkitError) as error:
            build(examples, tokenizer, **merged)
        assert all(key in str(error.value) for key in keys)


@pytest.mark.parametrize("override", ["task.doc_stride=0", "task.max_query_length=-1",
                                      "task.n_best_size=0", "task.max_answer_length=0"])
def test_a_window_or_answer_setting_out_of_range_is_refused_by_the_schema(override):
    """Each one's own range is the schema's, refused in one line naming the key before a
    finetune starts (the window functions check only the rule between them)."""
    key, value = override.split("=")
    with pytest.raises(BertkitError, match=rf"^{key.replace('.', r'[.]')}={value}: ") as error:
        check_ranges(compose_config(["recipe=squad", override]))
    assert "\n" not in str(error.value)


def test_doc_stride_just_below_the_room_is_accepted():
    assert check_window_settings(64, 48, 12) == 49


def test_numpy_offsets_roundtrip(windows):
    """Decoding reads offset_mapping column-wise from Arrow; nulls must survive there."""
    table = windows[1].with_format("arrow")[:]
    tokens = table.column("offset_mapping").combine_chunks().flatten()
    assert tokens.null_count == sum(len(ids) - sum(types) + 1 for ids, types in zip(
        windows[1]["input_ids"], windows[1]["token_type_ids"], strict=True))
    assert np.all(tokens.is_valid().to_numpy(zero_copy_only=False) == np.concatenate(
        [np.array(types[:-1] + [0]) == 1 for types in windows[1]["token_type_ids"]]))

"""The SQuAD JSON reader (bertkit.tasks.squad.files) against small hand-written files in the
official v1.1 / v2.0 layout, each of its error messages, the Hub path without network, and the real
dev files."""

from __future__ import annotations

import copy
import json
import logging

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.squad import files as squad_files
from bertkit.tasks.squad.files import FEATURES, read_squad_json, squad_from_hub
from tests.conftest import real_data_dir

CONTEXT_A0 = "The cat sat on the mat."
CONTEXT_A1 = "Paris is the capital of France."
CONTEXT_B0 = "Water boils at 100 degrees."

V1 = {
    "version": "1.1",
    "data": [
        {"title": "Cats", "paragraphs": [
            {"context": CONTEXT_A0, "qas": [
                {"id": "q2", "question": "Who sat?",
                 "answers": [{"text": "The cat", "answer_start": 0},
                             {"text": "cat", "answer_start": 4}]},
                {"id": "q1", "question": "Where?",
                 "answers": [{"text": "on the mat", "answer_start": 12}]},
            ]},
            {"context": CONTEXT_A1, "qas": [
                {"id": "q0", "question": "Capital of France?",
                 "answers": [{"text": "Paris", "answer_start": 0}]},
            ]},
        ]},
        {"title": "Water", "paragraphs": [
            {"context": CONTEXT_B0, "qas": [
                {"id": "q9", "question": "Boiling point?",
                 "answers": [{"text": "100 degrees", "answer_start": 15}]},
            ]},
        ]},
    ],
}

V2 = {
    "version": "v2.0",
    "data": [
        {"title": "Cats", "paragraphs": [
            {"context": CONTEXT_A0, "qas": [
                {"id": "a1", "question": "Who sat?", "is_impossible": False,
                 "answers": [{"text": "The cat", "answer_start": 0}]},
                {"id": "a2", "question": "Who stood?", "is_impossible": True, "answers": [],
                 "plausible_answers": [{"text": "The cat", "answer_start": 0}]},
                # No is_impossible at all (evaluate-v2.0.py never reads it): answers decide.
                {"id": "a3", "question": "What did the dog do?", "answers": []},
            ]},
        ]},
    ],
}


def write(tmp_path, payload, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


# --- reading -------------------------------------------------------------------------------


def test_v1_nested_structure_flattened_in_file_order(tmp_path):
    table = read_squad_json(write(tmp_path, V1), version="v1.1")
    assert table.features == FEATURES  # the Hub's rajpurkar/squad schema
    assert table.to_dict() == {
        "id": ["q2", "q1", "q0", "q9"],  # file order, not sorted
        "title": ["Cats", "Cats", "Cats", "Water"],
        "context": [CONTEXT_A0, CONTEXT_A0, CONTEXT_A1, CONTEXT_B0],
        "question": ["Who sat?", "Where?", "Capital of France?", "Boiling point?"],
        "answers": [
            {"text": ["The cat", "cat"], "answer_start": [0, 4]},  # every answer kept, in order
            {"text": ["on the mat"], "answer_start": [12]},
            {"text": ["Paris"], "answer_start": [0]},
            {"text": ["100 degrees"], "answer_start": [15]},
        ],
    }


def test_v2_impossible_questions_have_empty_answers_and_no_plausible_answers(tmp_path):
    table = read_squad_json(write(tmp_path, V2), version="v2.0")
    assert table.column_names == ["id", "title", "context", "question", "answers"]
    assert table["id"] == ["a1", "a2", "a3"]
    assert list(table["answers"]) == [
        {"text": ["The cat"], "answer_start": [0]},
        {"text": [], "answer_start": []},  # plausible_answers dropped: not answers
        {"text": [], "answer_start": []},
    ]


def test_bom_and_version_mismatch_are_tolerated(tmp_path, caplog):
    path = tmp_path / "dev.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(V1).encode())
    with caplog.at_level(logging.WARNING, logger="bertkit.tasks.squad.files"):
        table = read_squad_json(path, version="v2.0")  # a v1.1 file read as v2.0 is valid
    assert table.num_rows == 4
    assert "the file says version 1.1, read as SQuAD v2.0" in caplog.text


# --- errors --------------------------------------------------------------------------------


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{\n  "version": "1.1",\n  "data": [\n    {"title": "A", "paragraphs": []},\n'
                    '  ]\n}\n')  # trailing comma: the error is at line 5, column 3
    with pytest.raises(BertkitError, match=r"train\.json, line 5, column 3: not valid JSON "
                                           r"\(Expecting value\)"):
        read_squad_json(path, version="v1.1")


def test_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_bytes(b'{"version": "1.1",\n"data": [\n"\xff"]}')
    with pytest.raises(BertkitError, match=r"train\.json, line 3: not valid UTF-8"):
        read_squad_json(path, version="v1.1")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("data"), r"the top level has no 'data' key"),
    (lambda d: d["data"][1].pop("title"), r"data\[1\] has no 'title' key"),
    (lambda d: d["data"][0]["paragraphs"][1].pop("context"),
     r"data\[0\]\.paragraphs\[1\] has no 'context' key"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("id"),
     r"data\[0\]\.paragraphs\[0\]\.qas\[1\] has no 'id' key"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("question"),
     r"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(question id 'q1'\) has no 'question' key"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][1].pop("answer_start"),
     r"data\[0\]\.paragraphs\[0\]\.qas\[0\]\.answers\[1\] \(question id 'q2'\) "
     r"has no 'answer_start' key"),
    (lambda d: d["data"][1]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start="15"),
     r"data\[1\]\.paragraphs\[0\]\.qas\[0\]\.answers\[0\] \(question id 'q9'\)\.answer_start "
     r"is \"15\", expected an integer"),
    (lambda d: d["data"][0]["paragraphs"].__setitem__(0, ["not", "an", "object"]),
     r"data\[0\]\.paragraphs\[0\] is a list, expected an object"),
])
def test_missing_or_mistyped_key_names_its_location(tmp_path, edit, message):
    payload = copy.deepcopy(V1)
    edit(payload)
    with pytest.raises(BertkitError, match=r"data\.json: " + message):
        read_squad_json(write(tmp_path, payload), version="v1.1")


def bad_start_file(tmp_path):
    payload = copy.deepcopy(V1)
    # "Paris" is at 0; 1 points at "aris " (one character off, as in hand-edited files).
    payload["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] = 1
    return write(tmp_path, payload)


def test_bad_answer_start_is_an_error_by_default(tmp_path):
    with pytest.raises(BertkitError, match=(
            r"data\.json: data\[0\]\.paragraphs\[1\]\.qas\[0\]\.answers\[0\] "
            r"\(question id 'q0'\): answer_start 1 points at 'aris ' in the context, not at "
            r"the answer text 'Paris'.*on_bad_answer_start='warn'")):
        read_squad_json(bad_start_file(tmp_path), version="v1.1")


def test_bad_answer_start_warn_keeps_the_question(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bertkit.tasks.squad.files"):
        table = read_squad_json(bad_start_file(tmp_path), version="v1.1",
                                on_bad_answer_start="warn")
    assert table["id"] == ["q2", "q1", "q0", "q9"]  # nothing dropped
    assert table["answers"][2] == {"text": ["Paris"], "answer_start": [1]}  # kept as written
    assert "kept 1 answers whose answer_start does not match" in caplog.text
    assert "question id 'q0'" in caplog.text


@pytest.mark.parametrize("start", [-1, 40])
def test_answer_start_outside_the_context_is_bad(tmp_path, start):
    payload = copy.deepcopy(V1)
    # A negative start would slice from the end in Python; 40 is past the end of the
    # 31-character context.
    payload["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(
        text=".", answer_start=start)
    with pytest.raises(BertkitError, match=rf"answer_start {start} points at"):
        read_squad_json(write(tmp_path, payload), version="v1.1")


def test_duplicate_question_id_names_both_locations(tmp_path):
    payload = copy.deepcopy(V1)
    payload["data"][1]["paragraphs"][0]["qas"][0]["id"] = "q1"
    with pytest.raises(BertkitError, match=(
            r"data\[1\]\.paragraphs\[0\]\.qas\[0\] has question id 'q1', which "
            r"data\[0\]\.paragraphs\[0\]\.qas\[1\] already has")):
        read_squad_json(write(tmp_path, payload), version="v1.1")


def test_v2_impossible_question_with_answers(tmp_path):
    payload = copy.deepcopy(V2)
    qa = payload["data"][0]["paragraphs"][0]["qas"][1]
    qa["answers"] = qa.pop("plausible_answers")
    with pytest.raises(BertkitError, match=(
            r"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(question id 'a2'\) has is_impossible "
            r"true but 1 answers")):
        read_squad_json(write(tmp_path, payload), version="v2.0")


def test_v2_possible_question_without_answers(tmp_path):
    payload = copy.deepcopy(V2)
    payload["data"][0]["paragraphs"][0]["qas"][0]["answers"] = []
    with pytest.raises(BertkitError, match=r"\(question id 'a1'\) has is_impossible false but "
                                           r"no answers"):
        read_squad_json(write(tmp_path, payload), version="v2.0")


def test_v1_question_without_answers(tmp_path):
    with pytest.raises(BertkitError, match=r"qas\[1\] \(question id 'a2'\) has no answers; "
                                           r"every v1.1 question has at least one"):
        read_squad_json(write(tmp_path, V2), version="v1.1")


def test_bad_arguments_and_missing_file(tmp_path):
    path = write(tmp_path, V1)
    with pytest.raises(BertkitError, match=r"SQuAD version '1.1': expected one of v1.1, v2.0"):
        read_squad_json(path, version="1.1")
    with pytest.raises(BertkitError, match=r"on_bad_answer_start='skip': expected error or warn"):
        read_squad_json(path, version="v1.1", on_bad_answer_start="skip")
    with pytest.raises(BertkitError, match=r"nope\.json: file not found"):
        read_squad_json(tmp_path / "nope.json", version="v1.1")
    with pytest.raises(BertkitError, match=r"no questions"):
        read_squad_json(write(tmp_path, {"version": "1.1", "data": []}), version="v1.1")


# --- the Hub without network ---------------------------------------------------------------


def test_hub_dataset_names(monkeypatch, tmp_path):
    calls = []
    hub_table = read_squad_json(write(tmp_path, V2), version="v2.0")

    def load(path, split):
        calls.append((path, split))
        return hub_table
    monkeypatch.setattr(squad_files.datasets, "load_dataset", load)
    assert squad_from_hub("squad_v2", "validation")["id"] == ["a1", "a2", "a3"]
    squad_from_hub("squad", "train")
    squad_from_hub("rajpurkar/squad", "train")
    assert calls == [("rajpurkar/squad_v2", "validation"), ("rajpurkar/squad", "train"),
                     ("rajpurkar/squad", "train")]


def test_unreachable_hub_points_to_local_files(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'rajpurkar/squad_v2' on the Hub")
    monkeypatch.setattr(squad_files.datasets, "load_dataset", offline)
    with pytest.raises(BertkitError, match=(
            r"rajpurkar/squad_v2 \(ConnectionError: Couldn't reach.*"
            r"task\.train_file=<path to train-v2\.0\.json> "
            r"task\.validation_file=<path to dev-v2\.0\.json>")):
        squad_from_hub("squad_v2", "validation")
    with pytest.raises(BertkitError, match=r"task\.train_file=<path to train-v1\.1\.json>"):
        squad_from_hub("squad", "train")


def test_hub_table_without_squad_columns(monkeypatch):
    table = datasets.Dataset.from_dict({"id": ["x"], "text": ["y"]})
    monkeypatch.setattr(squad_files.datasets, "load_dataset", lambda *a, **k: table)
    with pytest.raises(BertkitError, match=r"no column\(s\) title, context, question, answers"):
        squad_from_hub("squad", "train")


# --- the real files ------------------------------------------------------------------------


@pytest.mark.real_data
def test_real_dev_v1():
    table = read_squad_json(real_data_dir() / "squad" / "dev-v1.1.json", version="v1.1")
    assert table.num_rows == 10570
    assert len(set(table["title"])) == 48
    assert all(len(answers["text"]) >= 1 for answers in table["answers"])


@pytest.mark.real_data
def test_real_dev_v2_reconstructed():
    table = read_squad_json(real_data_dir() / "squad" / "dev-v2.0.reconstructed.json",
                            version="v2.0")
    assert table.num_rows == 11873
    answerable = sum(1 for answers in table["answers"] if answers["text"])
    assert (answerable, table.num_rows - answerable) == (5928, 5945)

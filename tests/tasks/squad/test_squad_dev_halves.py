"""Splitting a SQuAD file by article: every question on exactly one side, no passage on both,
and both halves read back by the family's own reader."""

from __future__ import annotations

import json

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.squad.dev_halves import main, split_by_articles
from bertkit.tasks.squad.files import read_squad_json


def paragraph(a: int, p: int) -> dict:
    context = f"Passage {a}.{p} is about topic {a}."
    return {"context": context, "qas": [
        {"id": f"q{a}-{p}-{q}", "question": f"Which topic {q}?",
         "answers": [{"text": f"topic {a}", "answer_start": context.index("topic")}]}
        for q in range(2)]}


def squad_file(path, n_articles: int):
    data = [{"title": f"Article {a}", "paragraphs": [paragraph(a, p) for p in range(a % 3 + 1)]}
            for a in range(n_articles)]
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return data


def test_halves_partition_the_articles_in_order(tmp_path):
    data = squad_file(tmp_path / "dev-v1.1.json", 5)

    first, second = split_by_articles(tmp_path / "dev-v1.1.json", tmp_path / "out")

    assert first.name == "dev-v1.1.first-half.json" and second.name == "dev-v1.1.second-half.json"
    halves = [json.loads(path.read_text()) for path in (first, second)]
    assert [h["version"] for h in halves] == ["1.1", "1.1"]
    assert halves[0]["data"] == data[:3] and halves[1]["data"] == data[3:]
    read = [read_squad_json(path, version="v1.1") for path in (first, second)]
    ids = [set(table["id"]) for table in read]
    every = {qa["id"] for a in data for p in a["paragraphs"] for qa in p["qas"]}
    assert ids[0] | ids[1] == every and not ids[0] & ids[1]
    assert not set(read[0]["context"]) & set(read[1]["context"])


def test_command_line_prints_both_paths(tmp_path, capsys):
    squad_file(tmp_path / "dev.json", 2)
    main([str(tmp_path / "dev.json"), str(tmp_path / "out")])
    assert capsys.readouterr().out.split() == [str(tmp_path / "out" / "dev.first-half.json"),
                                               str(tmp_path / "out" / "dev.second-half.json")]


def test_a_file_that_cannot_be_split_is_named(tmp_path):
    squad_file(tmp_path / "one.json", 1)
    with pytest.raises(BertkitError, match="one.json: expected the official layout with at "
                                           "least 2 articles"):
        split_by_articles(tmp_path / "one.json", tmp_path / "out")

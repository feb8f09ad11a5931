"""The CoNLL column reader and the Hub loader: documents from -DOCSTART- lines, IOB1 -> IOB2,
scheme detection, errors naming file and line, and the real CoNLL-2003 files' counts."""

from __future__ import annotations

import datasets
import pytest

from bertkit.config_schema import check_ranges
from bertkit.data.task_data import split_files
from bertkit.errors import BertkitError
from bertkit.tasks.ner.data import OPTIONAL, REQUIRED, load_ner_splits
from bertkit.tasks.ner.files import (
    NO_DOCUMENT,
    conll_from_hub,
    inside_starts_entity,
    iob1_to_iob2,
    read_conll_file,
)
from tests.conftest import compose_config, real_data_dir
from tests.ner_fixtures import LABELS


@pytest.mark.parametrize(("iob1", "iob2"), [
    # B- between two adjacent entities of the same type (the only B- of IOB1).
    (["I-PER", "I-PER", "B-PER", "O"], ["B-PER", "I-PER", "B-PER", "O"]),
    # I- after O, and at the start of the sentence.
    (["O", "I-LOC", "I-LOC", "O", "I-LOC"], ["O", "B-LOC", "I-LOC", "O", "B-LOC"]),
    (["I-MISC"], ["B-MISC"]),
    # I- after an entity of another type starts a new entity.
    (["I-ORG", "I-LOC", "I-LOC", "I-PER"], ["B-ORG", "B-LOC", "I-LOC", "B-PER"]),
    (["I-ORG", "B-ORG", "I-ORG", "I-MISC", "B-MISC"],
     ["B-ORG", "B-ORG", "I-ORG", "B-MISC", "B-MISC"]),
    # IOB2 already: unchanged.
    (["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"],
     ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]),
    (["O", "O"], ["O", "O"]),
])
def test_iob1_to_iob2(iob1, iob2):
    assert iob1_to_iob2(iob1) == iob2
    assert iob1_to_iob2(iob2) == iob2  # idempotent: IOB2 input is never changed
    assert not any(inside_starts_entity(iob2, i) for i in range(len(iob2)))


def write(tmp_path, text: str, name: str = "data.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


DOCUMENTS = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O
-DOCSTART- -X- -X- O
-DOCSTART- -X- -X- O

The DT B-NP O



European NNP I-NP B-ORG
"""


def test_reader_keeps_documents_lines_and_tags(tmp_path):
    table = read_conll_file(write(tmp_path, DOCUMENTS), labels=LABELS)
    assert table.tokens == [["EU", "rejects", "German"], ["Peter", "Blackburn"],
                            ["BRUSSELS", "1996-08-22"], ["The"], ["European"]]
    assert table.tags == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"], ["B-LOC", "O"],
                          ["O"], ["B-ORG"]]
    # A -DOCSTART- line ends a sentence even without a blank line; two in a row make no
    # empty document; several blank lines are one sentence break.
    assert table.documents == [0, 0, 1, 2, 2]
    assert table.lines == [3, 7, 12, 17, 21]
    assert table.scheme == "iob2"


def test_file_without_docstart_is_one_document(tmp_path):
    table = read_conll_file(write(tmp_path, "a x y O\n\nb x y B-LOC\n\r\nc x y O\r\n"),
                            labels=LABELS)
    assert table.documents == [0, 0, 0]
    assert table.tokens == [["a"], ["b"], ["c"]]


IOB1_FILE = """-DOCSTART- -X- -X- O

U.N. NNP I-NP I-ORG
official NN I-NP O
Ekeus NNP I-NP I-PER
heads VBZ I-VP O
for IN I-PP O
Baghdad NNP I-NP I-LOC
Fischler NNP I-NP I-PER
Kurt NNP I-NP B-PER
Hansen NNP I-NP I-PER
"""


def test_auto_detects_iob1_and_converts(tmp_path):
    table = read_conll_file(write(tmp_path, IOB1_FILE), labels=LABELS, tag_scheme="auto")
    assert table.scheme == "iob1"
    assert table.tags == [["B-ORG", "O", "B-PER", "O", "O", "B-LOC", "B-PER", "B-PER",
                           "I-PER"]]
    forced = read_conll_file(write(tmp_path, IOB1_FILE), labels=LABELS, tag_scheme="iob1")
    assert forced.tags == table.tags


def test_iob2_refuses_an_inside_tag_that_starts_an_entity(tmp_path):
    path = write(tmp_path, IOB1_FILE)
    with pytest.raises(BertkitError, match=rf"{path}, line 3: tag 'I-ORG' starts an entity.*"
                                           r"task.tag_scheme=iob1 or auto"):
        read_conll_file(path, labels=LABELS, tag_scheme="iob2")


def test_iob1_setting_on_an_iob2_file_changes_nothing(tmp_path):
    auto = read_conll_file(write(tmp_path, DOCUMENTS), labels=LABELS)
    iob1 = read_conll_file(write(tmp_path, DOCUMENTS), labels=LABELS, tag_scheme="iob1")
    assert iob1.tags == auto.tags


@pytest.mark.parametrize(("line", "message"), [
    ("Blackburn NNP I-PER", r"line 8: 3 white-space separated fields, expected 4"),
    ("Blackburn NNP I-NP I-PER extra", r"line 8: 5 white-space separated fields, expected 4"),
    ("Blackburn NNP I-NP B-FOO", r"line 8: tag 'B-FOO' is not one of the task's labels"),
    ("Blackburn NNP I-NP X", r"line 8: tag 'X' is not one of the task's labels"),
    ("Blackburn NNP I-NP i-per", r"line 8: tag 'i-per' is not one of the task's labels"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    lines = DOCUMENTS.split("\n")
    assert lines[7].startswith("Blackburn")
    lines[7] = line
    path = write(tmp_path, "\n".join(lines))
    with pytest.raises(BertkitError, match=rf"^{path}, {message}"):
        read_conll_file(path, labels=LABELS)


def test_other_file_errors(tmp_path):
    with pytest.raises(BertkitError, match="file not found"):
        read_conll_file(tmp_path / "absent.txt", labels=LABELS)
    with pytest.raises(BertkitError, match="no sentences"):
        read_conll_file(write(tmp_path, "-DOCSTART- -X- -X- O\n\n\n"), labels=LABELS)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"a x y O\n\n\xe9t\xe9 x y O\n")
    with pytest.raises(BertkitError, match=rf"{bad}, line 3: not valid UTF-8"):
        read_conll_file(bad, labels=LABELS)
    # Not a file error: task.tag_scheme's choices are the schema's, refused before any file
    # is read (read_conll_file takes the scheme as given).
    with pytest.raises(BertkitError, match=r"^task\.tag_scheme='bio': expected one of auto, "):
        check_ranges(compose_config(["recipe=ner", "task.tag_scheme=bio"]))


def test_two_column_files_with_columns_settings(tmp_path):
    path = write(tmp_path, "Peter B-PER\nBlackburn I-PER\n\nsaid O\n")
    table = read_conll_file(path, labels=LABELS, num_columns=2, token_column=0, tag_column=1)
    assert table.tags == [["B-PER", "I-PER"], ["O"]]


def hub_conll() -> datasets.DatasetDict:
    # The Hub's names in another order than the task's, to check mapping by name.
    names = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    features = datasets.Features({
        "id": datasets.Value("string"),
        "tokens": datasets.List(datasets.Value("string")),
        "ner_tags": datasets.List(datasets.ClassLabel(names=names)),
    })

    def split(rows):
        return datasets.Dataset.from_dict(
            {"id": [str(i) for i in range(len(rows))], "tokens": [r[0] for r in rows],
             "ner_tags": [[names.index(t) for t in r[1]] for r in rows]}, features=features)

    return datasets.DatasetDict({
        "train": split([(["Peter", "Blackburn", "in", "Paris"], ["B-PER", "I-PER", "O",
                                                                  "B-LOC"])]),
        "validation": split([(["EU", "said"], ["B-ORG", "O"]), ([], [])]),
        "test": split([(["German"], ["I-MISC"])]),  # IOB1-style: converted
    })


def test_hub_tags_are_named_by_the_dataset_features(monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a: calls.append(a) or hub_conll())
    task = compose_config(["recipe=ner"]).task
    splits = load_ner_splits(task)
    assert calls == [("lhoestq/conll2003", None)]
    names = list(task.labels)
    assert [names[i] for i in splits["train"]["ner_tags"][0]] == ["B-PER", "I-PER", "O",
                                                                    "B-LOC"]
    assert splits["validation"]["tokens"] == [["EU", "said"]]  # the empty row is dropped
    assert [names[i] for i in splits["test"]["ner_tags"][0]] == ["B-MISC"]
    assert splits.facts["test"]["tag_scheme"] == "iob1"
    assert splits["train"]["document"] == [NO_DOCUMENT]


def test_hub_unknown_tag_and_missing_column(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a: hub_conll())
    with pytest.raises(BertkitError, match=r"\(train\), row 0: tag 'B-PER' is not one of"):
        conll_from_hub("conll2003", None, labels=["O", "B-LOC", "I-LOC"])
    with pytest.raises(BertkitError, match="has no column.*labels.*task.hub.columns"):
        conll_from_hub("conll2003", None, labels=LABELS, tags_column="labels")


def test_unreachable_hub_points_to_the_files(monkeypatch):
    def offline(*args):
        raise ConnectionError("Couldn't reach 'conll2003' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    task = compose_config(["recipe=ner"]).task
    with pytest.raises(BertkitError, match=r"could not load the Hub dataset lhoestq/conll2003 "
                                           r"\(ConnectionError.*task.data_dir=<dir with "
                                           r"train.txt, valid.txt, test.txt>"):
        load_ner_splits(task)


def local_split_files(task):
    return split_files(task, REQUIRED, "the usual layout", optional=OPTIONAL)


def test_split_files_from_data_dir_and_single_files(tmp_path):
    (tmp_path / "train.txt").write_text("a x y O\n")
    (tmp_path / "valid.txt").write_text("a x y O\n")
    task = compose_config(["recipe=ner", f"task.data_dir={tmp_path}"]).task
    assert local_split_files(task) == {"train": tmp_path / "train.txt",
                                       "validation": tmp_path / "valid.txt"}  # no test.txt
    other = write(tmp_path, "b x y O\n", "other.txt")
    task = compose_config(["recipe=ner", f"task.data_dir={tmp_path}",
                           f"task.test_file={other}"]).task
    assert local_split_files(task)["test"] == other
    (tmp_path / "valid.txt").unlink()
    with pytest.raises(BertkitError, match=r"task.data_dir: .*valid.txt not found"):
        local_split_files(task)
    task = compose_config(["recipe=ner", f"task.train_file={other}"]).task
    with pytest.raises(BertkitError, match=r"no validation file \(task.data_dir or "
                                           r"task.validation_file\)"):
        local_split_files(task)


@pytest.mark.real_data
def test_real_conll2003_files():
    root = real_data_dir() / "conll2003"
    counts = {"train.txt": (14041, 946, 23499), "valid.txt": (3250, 216, 5942),
              "test.txt": (3453, 231, 5648)}
    for name, (sentences, documents, entities) in counts.items():
        table = read_conll_file(root / name, labels=LABELS)
        assert len(table.tokens) == sentences
        assert max(table.documents) + 1 == len(set(table.documents)) == documents
        assert table.scheme == "iob2"
        assert sum(tag.startswith("B-") for tags in table.tags for tag in tags) == entities


def test_hub_class_ids_without_names_use_tag_names(monkeypatch):
    plain = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"tokens": [["Peter", "Blackburn", "said"]], "ner_tags": [[1, 2, 0]]})})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: plain)
    loaded = conll_from_hub("copy", None, labels=LABELS, tag_names=LABELS)
    assert loaded["train"].tags == [["B-PER", "I-PER", "O"]]
    with pytest.raises(BertkitError, match="class ids without names.*task.hub.tag_names"):
        conll_from_hub("copy", None, labels=LABELS)
    with pytest.raises(BertkitError, match="class id out of range"):
        conll_from_hub("copy", None, labels=LABELS, tag_names=["O", "B-PER"])

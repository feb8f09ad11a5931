"""The GLUE tsv reader (bertkit.tasks.glue.data) and local split loading
(bertkit.tasks.glue.data) against small files that reproduce each quirk of the real files,
with exact expected outputs."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue.data import load_glue_splits, read_glue_file
from tests.conftest import GLUE_TASKS, compose_config
from tests.glue_fixtures import HEADERS

PAIR_COLUMNS = {"text_a": "sentence1", "text_b": "sentence2", "label": "label", "index": "index"}
SINGLE_COLUMNS = {"text_a": "sentence", "text_b": None, "label": "label", "index": "index"}
COLA_COLUMNS = SINGLE_COLUMNS
COLA_HEADERLESS = {"text_a": 3, "label": 1}
MRPC_COLUMNS = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality", "index": "index"}
STSB_COLUMNS = {"text_a": "sentence1", "text_b": "sentence2", "label": "score", "index": "index"}
STSB_HEADER = "\t".join(HEADERS["stsb"][0])


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def task_config(task: str, data_dir: Path | None = None, *extra: str):
    overrides = ["recipe=glue", f"task={task}", "logger=none"]
    if data_dir is not None:
        overrides.append(f"task.data_dir={data_dir}")
    return compose_config([*overrides, *extra]).task


# --- MRPC: UTF-8 BOM before the header ------------------------------------------------------


def test_mrpc_bom_header_is_found(tmp_path):
    path = write(tmp_path / "train.tsv",
                 "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                 "1\t702876\t702977\tAmrozi accused his brother.\tReferring to him, Amrozi said.\n"
                 "0\t2108705\t2108831\tYucaipa owned Dominick's.\tYucaipa bought Dominick's.\n")
    assert path.read_bytes().startswith(b"\xef\xbb\xbfQuality")  # the quirk is really there
    table = read_glue_file(path, columns=MRPC_COLUMNS, labels=["0", "1"])
    assert table == {
        "text_a": ["Amrozi accused his brother.", "Yucaipa owned Dominick's."],
        "text_b": ["Referring to him, Amrozi said.", "Yucaipa bought Dominick's."],
        "label": [1, 0],
        "idx": [0, 1],  # MRPC train/dev have no index column: row position
    }


def test_bom_is_not_left_on_the_header_name(tmp_path):
    """Without BOM handling, the label column would be '\\ufeffQuality' and not be found."""
    path = write(tmp_path / "dev.tsv", "\ufeffQuality\t#1 String\t#2 String\n1\ta\tb\n")
    table = read_glue_file(path, columns={"text_a": "#1 String", "text_b": "#2 String",
                                          "label": "Quality"}, labels=["0", "1"])
    assert table["label"] == [1]


# --- CoLA: no header on train/dev, a header on test, no final newline on dev ----------------


COLA_TRAIN = (
    "gj04\t1\t\tOur friends won't buy this analysis.\n"
    "gj04\t0\t*\tThe more we study verbs, the crazier they get get.\n"
    "cj99\t1\t\tShe \"ran.\n"
)


def test_cola_headerless_train_four_columns(tmp_path):
    path = write(tmp_path / "train.tsv", COLA_TRAIN)
    table = read_glue_file(path, columns=COLA_COLUMNS, labels=["0", "1"], has_header=False,
                           headerless_columns=COLA_HEADERLESS)
    assert table == {
        "text_a": ["Our friends won't buy this analysis.",
                   "The more we study verbs, the crazier they get get.",
                   'She "ran.'],
        "label": [1, 0, 1],
        "idx": [0, 1, 2],
    }


def test_cola_first_row_is_data_not_header(tmp_path):
    """Reading a headerless file as if it had a header loses the first example (and fails
    because 'sentence' is not a column): the task config must say which splits lack one."""
    path = write(tmp_path / "train.tsv", COLA_TRAIN)
    with pytest.raises(BertkitError, match=r"no column 'sentence'.*task\.columns\.text_a"):
        read_glue_file(path, columns=COLA_COLUMNS, labels=["0", "1"], has_header=True)


def test_cola_headerless_without_headerless_columns_is_an_error(tmp_path):
    path = write(tmp_path / "train.tsv", COLA_TRAIN)
    with pytest.raises(BertkitError, match="task.headerless_columns"):
        read_glue_file(path, columns=COLA_COLUMNS, labels=["0", "1"], has_header=False)


def test_cola_dev_without_final_newline_keeps_last_row(tmp_path):
    path = write(tmp_path / "dev.tsv", "gj04\t1\t\tFirst one.\nclc95\t0\t*\tLast one no newline.")
    assert not path.read_bytes().endswith(b"\n")
    table = read_glue_file(path, columns=COLA_COLUMNS, labels=["0", "1"], has_header=False,
                           headerless_columns=COLA_HEADERLESS)
    assert table["text_a"] == ["First one.", "Last one no newline."]
    assert table["label"] == [1, 0]


def test_cola_splits_from_config(tmp_path):
    """Through the real cola.yaml: train/dev headerless, test with `index\\tsentence`."""
    write(tmp_path / "train.tsv", COLA_TRAIN)
    write(tmp_path / "dev.tsv", "gj04\t0\t*\tBad bad.\ngj04\t1\t\tGood.")
    write(tmp_path / "test.tsv", "index\tsentence\n0\tTest one.\n1\t\"Test two.\n")
    splits = load_glue_splits(task_config("cola", tmp_path))
    assert set(splits) == {"train", "validation", "test"}
    assert splits["train"]["label"] == [1, 0, 1]
    assert splits["validation"].to_dict() == {
        "text_a": ["Bad bad.", "Good."], "idx": [0, 1], "label": [0, 1]}
    assert splits["test"].to_dict() == {"text_a": ["Test one.", '"Test two.'], "idx": [0, 1]}


# --- Fields that open with a bare quote: QUOTE_NONE ------------------------------------------


UNCLOSED_QUOTE = (
    "index\tsentence1\tsentence2\tlabel\n"
    "0\tA plane is taking off.\tAn air plane is taking off.\tentailment\n"
    "1\t\"The cat sat on the mat.\tA cat sat.\tentailment\n"
    "2\tA man plays.\tA man plays a flute.\tnot_entailment\n"
    "3\tDogs run.\tAnimals run.\tentailment\n"
)


def test_unclosed_quote_stays_one_row_per_line(tmp_path):
    path = write(tmp_path / "dev.tsv", UNCLOSED_QUOTE)
    table = read_glue_file(path, columns=PAIR_COLUMNS, labels=["entailment", "not_entailment"])
    assert len(table["text_a"]) == 4
    assert table["text_a"] == ["A plane is taking off.", '"The cat sat on the mat.',
                               "A man plays.", "Dogs run."]
    assert table["text_b"][1] == "A cat sat."
    assert table["label"] == [0, 0, 1, 0]
    assert table["idx"] == [0, 1, 2, 3]


def test_default_csv_quoting_would_merge_rows():
    """Independent check that the quirk matters: csv's default quoting swallows the rest of the
    file into the field that opened with a quote, so the rows after it are lost."""
    default = list(csv.reader(io.StringIO(UNCLOSED_QUOTE), delimiter="\t"))
    quote_none = list(csv.reader(io.StringIO(UNCLOSED_QUOTE), delimiter="\t",
                                 quoting=csv.QUOTE_NONE))
    assert len(quote_none) == 5  # header + 4 rows
    assert len(default) < len(quote_none)
    assert len(default) == 3  # header, row 0, and one merged row
    assert "A man plays." in default[2][1]  # row 2's text ended up inside row 1's field


def test_line_breaks_are_only_newlines(tmp_path):
    """U+2028, U+0085 and form feed inside a field do not end the row (as with open() in the
    original processors; str.splitlines() would split there)."""
    path = write(tmp_path / "train.tsv",
                 "sentence\tlabel\n"
                 "one\u2028two\t1\n"
                 "three\x85four\x0cfive\t0\n"
                 "six\t1\n")
    table = read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])
    assert table["text_a"] == ["one\u2028two", "three\x85four\x0cfive", "six"]
    assert table["label"] == [1, 0, 1]


def test_line_numbers_count_after_odd_separators(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\none\u2028two\t1\nbad\t7\n")
    with pytest.raises(BertkitError, match=r"line 3: label '7'"):
        read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])


# --- MNLI: two dev and two test files ------------------------------------------------------


MNLI_HEADER = HEADERS["mnli"][0]
MNLI_TEST_HEADER = HEADERS["mnli"][1]


def _mnli_row(i: int, a: str, b: str, label: str | None) -> str:
    fields = [str(i), str(100 + i), f"{100 + i}e", "fiction", "( x )", "( y )", "(S x)", "(S y)",
              a, b] + ([label, label] if label else [])
    return "\t".join(fields)


def write_mnli(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    head, test_head = "\t".join(MNLI_HEADER), "\t".join(MNLI_TEST_HEADER)
    rows = {
        "train.tsv": [("Train a.", "Train b.", "neutral"), ("T2.", "T2b.", "entailment"),
                      ("T3.", "T3b.", "contradiction")],
        "dev_matched.tsv": [("M a.", "M b.", "entailment"), ("M2.", "M2b.", "neutral")],
        "dev_mismatched.tsv": [("MM a.", "MM b.", "contradiction")],
        "test_matched.tsv": [("TM a.", "TM b.", None), ("TM2.", "TM2b.", None)],
        "test_mismatched.tsv": [("TMM a.", "TMM b.", None)],
    }
    for name, items in rows.items():
        header = test_head if name.startswith("test") else head
        lines = [header] + [_mnli_row(10 + i, *item) for i, item in enumerate(items)]
        write(directory / name, "\n".join(lines) + "\n")
    return directory


def test_mnli_two_validation_and_two_test_splits(tmp_path):
    directory = write_mnli(tmp_path / "MNLI")
    splits = load_glue_splits(task_config("mnli", directory))
    assert set(splits) == {"train", "validation_matched", "validation_mismatched",
                           "test_matched", "test_mismatched"}
    # labels: ["contradiction", "entailment", "neutral"]
    assert splits["train"]["label"] == [2, 1, 0]
    assert splits["validation_matched"].to_dict() == {
        "text_a": ["M a.", "M2."], "idx": [10, 11], "text_b": ["M b.", "M2b."], "label": [1, 2]}
    assert splits["validation_mismatched"].to_dict() == {
        "text_a": ["MM a."], "idx": [10], "text_b": ["MM b."], "label": [0]}
    for split, expected in (("test_matched", ["TM a.", "TM2."]), ("test_mismatched", ["TMM a."])):
        assert "label" not in splits[split].column_names
        assert splits[split]["text_a"] == expected


def test_mnli_validation_file_replaces_both_dev_splits(tmp_path):
    directory = write_mnli(tmp_path / "MNLI")
    only = write(tmp_path / "my_dev.tsv",
                 "\t".join(MNLI_HEADER) + "\n" + _mnli_row(5, "Own.", "Dev.", "neutral") + "\n")
    splits = load_glue_splits(task_config("mnli", directory, f"task.validation_file={only}"))
    assert set(splits) == {"train", "validation", "test_matched", "test_mismatched"}
    assert splits["validation"].to_dict() == {
        "text_a": ["Own."], "idx": [5], "text_b": ["Dev."], "label": [2]}


def test_override_file_need_not_exist_in_data_dir(tmp_path):
    """A data_dir with only dev.tsv (like the QNLI files at hand) plus task.train_file."""
    directory = tmp_path / "QNLI"
    directory.mkdir()
    dev = write(directory / "dev.tsv",
                "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tentailment\n")
    train = write(tmp_path / "train_elsewhere.tsv",
                  "index\tquestion\tsentence\tlabel\n7\tWhat?\tThat.\tnot_entailment\n")
    splits = load_glue_splits(task_config("qnli", directory, f"task.train_file={train}"))
    assert set(splits) == {"train", "validation"}
    assert splits["train"].to_dict() == {
        "text_a": ["What?"], "idx": [7], "text_b": ["That."], "label": [1]}
    assert splits["validation"]["text_a"] == ["Who?"]
    assert dev.is_file()


# --- STS-B: float labels and their range ---------------------------------------------------


def test_stsb_float_labels(tmp_path):
    path = write(tmp_path / "train.tsv",
                 STSB_HEADER + "\n"
                 "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tA jet.\t5.000\n"
                 "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man.\tA guy.\t3.800\n"
                 "2\tmain-news\theadlines\t2013\t0007\tnone\tnone\tX.\tY.\t0\n")
    table = read_glue_file(path, columns=STSB_COLUMNS, labels=None, label_range=[0.0, 5.0])
    assert table["label"] == [5.0, 3.8, 0.0]
    assert all(type(score) is float for score in table["label"])
    assert table["text_b"] == ["A jet.", "A guy.", "Y."]
    assert table["idx"] == [0, 1, 2]


def test_stsb_score_outside_label_range(tmp_path):
    path = write(tmp_path / "dev.tsv",
                 STSB_HEADER + "\n"
                 "0\tg\tf\ty\t1\tnone\tnone\tA.\tB.\t4.2\n"
                 "1\tg\tf\ty\t2\tnone\tnone\tC.\tD.\t5.25\n")
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=STSB_COLUMNS, labels=None, label_range=[0.0, 5.0])
    message = str(err.value)
    assert str(path) in message
    assert "line 3" in message
    assert "5.25" in message and "task.label_range" in message


def test_stsb_score_range_from_config(tmp_path, glue_dir):
    directory = glue_dir("stsb")
    lines = (directory / "dev.tsv").read_text().splitlines()
    fields = lines[4].split("\t")
    fields[-1] = "-0.5"
    lines[4] = "\t".join(fields)
    (directory / "dev.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(BertkitError, match=r"dev\.tsv, line 5: label -0\.5 is outside"):
        load_glue_splits(task_config("stsb", directory))


def test_stsb_label_not_a_number(tmp_path):
    path = write(tmp_path / "train.tsv", STSB_HEADER + "\n0\tg\tf\ty\t1\tn\tn\tA.\tB.\thigh\n")
    with pytest.raises(BertkitError, match=r"line 2: label 'high' is not a number"):
        read_glue_file(path, columns=STSB_COLUMNS, labels=None, label_range=[0.0, 5.0])


# --- Errors: each names the file and line, or the config key ------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tsv"
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])
    assert str(path) in str(err.value) and "file not found" in str(err.value)


def test_missing_single_file_names_config_key(tmp_path, glue_dir):
    missing = tmp_path / "missing_train.tsv"
    with pytest.raises(BertkitError, match=re.escape(f"task.train_file={missing}")):
        load_glue_splits(task_config("rte", glue_dir("rte"), f"task.train_file={missing}"))


def test_missing_column_in_header(tmp_path):
    path = write(tmp_path / "train.tsv", "index\tsentence1\tsentnce2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=PAIR_COLUMNS, labels=["entailment", "not_entailment"])
    message = str(err.value)
    assert str(path) in message and "line 1" in message
    assert "'sentence2'" in message
    assert "task.columns.text_b" in message


def test_missing_label_column_is_fine_on_test_but_not_on_train(tmp_path):
    path = write(tmp_path / "test.tsv", "index\tsentence1\tsentence2\n4\ta\tb\n")
    table = read_glue_file(path, columns=PAIR_COLUMNS, labels=["0", "1"], need_label=False)
    assert table == {"text_a": ["a"], "text_b": ["b"], "idx": [4]}
    with pytest.raises(BertkitError, match=r"no column 'label'.*task\.columns\.label"):
        read_glue_file(path, columns=PAIR_COLUMNS, labels=["0", "1"], need_label=True)


def test_label_outside_label_set(tmp_path):
    path = write(tmp_path / "dev.tsv",
                 "index\tsentence1\tsentence2\tlabel\n"
                 "0\ta\tb\tentailment\n"
                 "1\tc\td\tentailment\n"
                 "2\te\tf\tcontradiction\n")
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=PAIR_COLUMNS, labels=["entailment", "not_entailment"])
    message = str(err.value)
    assert str(path) in message
    assert "line 4" in message
    assert "'contradiction'" in message and "task.labels" in message


def test_too_few_fields(tmp_path):
    path = write(tmp_path / "train.tsv",
                 "index\tsentence1\tsentence2\tlabel\n"
                 "0\ta\tb\t1\n"
                 "1\tc\td\t0\n"
                 "2\te only\n"
                 "3\tg\th\t1\n")
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=PAIR_COLUMNS, labels=["0", "1"])
    message = str(err.value)
    assert str(path) in message
    assert "line 4: 2 tab-separated fields, expected at least 4" in message
    assert "task.skip_malformed_rows" in message


def test_skip_malformed_rows(tmp_path):
    path = write(tmp_path / "train.tsv",
                 "index\tsentence1\tsentence2\tlabel\n0\ta\tb\t1\n2\te only\n3\tg\th\t0\n")
    table = read_glue_file(path, columns=PAIR_COLUMNS, labels=["0", "1"],
                           skip_malformed_rows=True)
    assert table == {"text_a": ["a", "g"], "text_b": ["b", "h"], "label": [1, 0], "idx": [0, 3]}


def test_data_dir_missing_dev(tmp_path, glue_dir):
    directory = glue_dir("rte")
    (directory / "dev.tsv").unlink()
    with pytest.raises(BertkitError) as err:
        load_glue_splits(task_config("rte", directory))
    message = str(err.value)
    assert f"task.data_dir={directory}" in message
    assert "no dev.tsv" in message and "validation" in message


def test_data_dir_missing_test_is_fine(glue_dir):
    directory = glue_dir("rte")
    (directory / "test.tsv").unlink()
    assert set(load_glue_splits(task_config("rte", directory))) == {"train", "validation"}


def test_data_dir_that_does_not_exist(tmp_path):
    with pytest.raises(BertkitError, match=r"task\.data_dir=.*no such directory"):
        load_glue_splits(task_config("rte", tmp_path / "absent"))


def test_invalid_utf8(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\nfine\t1\nbro\xffken\t0\nfine again\t1\n")
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])
    message = str(err.value)
    assert str(path) in message
    assert "line 3" in message and "UTF-8" in message


def test_empty_file(tmp_path):
    path = write(tmp_path / "train.tsv", "")
    with pytest.raises(BertkitError, match="empty"):
        read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])


def test_header_only_file_has_no_examples(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\n")
    with pytest.raises(BertkitError, match="no examples"):
        read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])


# --- idx ---------------------------------------------------------------------------------


def test_idx_from_index_column(tmp_path):
    path = write(tmp_path / "dev.tsv",
                 "index\tsentence1\tsentence2\tlabel\n"
                 "40\ta\tb\t0\n"
                 "7\tc\td\t1\n"
                 "1000\te\tf\t1\n")
    table = read_glue_file(path, columns=PAIR_COLUMNS, labels=["0", "1"])
    assert table["idx"] == [40, 7, 1000]


def test_idx_is_row_position_without_index_column(tmp_path):
    path = write(tmp_path / "dev.tsv", "sentence\tlabel\nx\t0\ny\t1\nz\t0\n")
    table = read_glue_file(path, columns=SINGLE_COLUMNS, labels=["0", "1"])
    assert table["idx"] == [0, 1, 2]


def test_idx_index_column_not_first(tmp_path):
    """QQP's index column is `id`, in column 0; MNLI's `index` precedes other ids."""
    path = write(tmp_path / "dev.tsv",
                 "qid1\tid\tquestion1\tquestion2\tis_duplicate\n"
                 "11\t3\tWhy?\tHow?\t0\n"
                 "12\t9\tWho?\tWhom?\t1\n")
    table = read_glue_file(path, labels=["0", "1"], columns={
        "text_a": "question1", "text_b": "question2", "label": "is_duplicate", "index": "id"})
    assert table == {"text_a": ["Why?", "Who?"], "text_b": ["How?", "Whom?"],
                     "label": [0, 1], "idx": [3, 9]}


# --- All nine tasks on the fixture directories --------------------------------------------


PAIR_TASKS = {"mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}


def _expected_files(task: str) -> dict[str, tuple[str, int]]:
    """Split -> (file, row count) as conftest's glue_dir writes them (24 / 12 / 6)."""
    if task == "mnli":
        return {"train": ("train.tsv", 24), "validation_matched": ("dev_matched.tsv", 12),
                "validation_mismatched": ("dev_mismatched.tsv", 12),
                "test_matched": ("test_matched.tsv", 6),
                "test_mismatched": ("test_mismatched.tsv", 6)}
    return {"train": ("train.tsv", 24), "validation": ("dev.tsv", 12), "test": ("test.tsv", 6)}


def _reference_texts(path: Path, task: str, column: str) -> list[str]:
    """An independent reading: split the file on newlines and tabs, no csv module."""
    lines = path.read_text(encoding="utf-8-sig").split("\n")
    lines = [line for line in lines if line]
    if task == "cola" and not path.name.startswith("test"):
        position = 3
    else:
        header, lines = lines[0].split("\t"), lines[1:]
        position = header.index(column)
    return [line.split("\t")[position] for line in lines]


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_all_tasks_on_fixture_files(task, glue_dir):
    directory = glue_dir(task)
    config = task_config(task, directory)
    splits = load_glue_splits(config)
    expected = _expected_files(task)
    assert set(splits) == set(expected)
    for split, (name, count) in expected.items():
        table = splits[split]
        columns = {"text_a", "idx"}
        if task in PAIR_TASKS:
            columns.add("text_b")
        if not split.startswith("test"):
            columns.add("label")
        assert set(table.column_names) == columns, split
        assert table.num_rows == count, split
        assert table["idx"] == list(range(count)), split
        reference = _reference_texts(directory / name, task, config.columns.text_a)
        assert table["text_a"] == reference, split
        # Row 1 of every file opens text_a with a bare quote (row 2 text_b): kept as is.
        assert table["text_a"][1].startswith('"') and not table["text_a"][0].startswith('"')
        if task in PAIR_TASKS:
            assert table["text_b"] == _reference_texts(directory / name, task,
                                                       config.columns.text_b)
            assert table["text_b"][2].startswith('"')
        if "label" in columns:
            gold = _reference_texts(directory / name, task, config.columns.label) \
                if task != "cola" else [
                    line.split("\t")[1]
                    for line in (directory / name).read_text().split("\n") if line]
            if task == "stsb":
                assert table["label"] == [float(g) for g in gold]
            else:
                assert table["label"] == [list(config.labels).index(g) for g in gold]

"""Every GLUE file under $BERTKIT_DATA/glue, read with the real task configs: the example
counts of shared/data/SOURCES.md exactly, label sets, and the quirks the reader must handle.

Skipped unless BERTKIT_DATA is set (e.g. BERTKIT_DATA=../shared/data)."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

import pytest

from bertkit.tasks.glue.data import load_glue_splits, read_glue_file
from tests.conftest import compose_config, real_data_dir

pytestmark = pytest.mark.real_data

# Task -> directory under glue/, and example counts per file (SOURCES.md, "count" column).
TASK_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qnli": "QNLI",
             "rte": "RTE", "wnli": "WNLI"}
EXAMPLE_COUNTS = {
    "CoLA/train.tsv": 8551, "CoLA/dev.tsv": 1043,
    "SST-2/train.tsv": 67349, "SST-2/dev.tsv": 872,
    "MRPC/train.tsv": 3668, "MRPC/dev.tsv": 408,
    "STS-B/train.tsv": 5749, "STS-B/dev.tsv": 1500,
    "QNLI/dev.tsv": 5463,
    "RTE/train.tsv": 2490, "RTE/dev.tsv": 277,
    "WNLI/train.tsv": 635, "WNLI/dev.tsv": 71,
}
# Label names as they are written in the files.
FILE_LABELS = {"cola": {"0", "1"}, "sst2": {"0", "1"}, "mrpc": {"0", "1"}, "wnli": {"0", "1"},
               "rte": {"entailment", "not_entailment"}, "qnli": {"entailment", "not_entailment"}}
PAIR_TASKS = {"mrpc", "stsb", "qnli", "rte", "wnli"}
HAS_INDEX_COLUMN = {"stsb", "qnli", "rte", "wnli"}


@pytest.fixture(scope="module")
def glue_root() -> Path:
    root = real_data_dir() / "glue"
    if not root.is_dir():
        pytest.fail(f"BERTKIT_DATA is set but {root} does not exist")
    return root


def task_config(task: str, glue_root: Path):
    directory = glue_root / TASK_DIRS[task]
    overrides = ["recipe=glue", f"task={task}", f"task.data_dir={directory}", "logger=none"]
    if task == "qnli":  # only dev.tsv is at hand (QNLI train is over the size limit)
        overrides.append(f"task.train_file={directory / 'dev.tsv'}")
    return compose_config(overrides).task


def file_split(task_cfg, name: str) -> str:
    return next(split for split, file in task_cfg.files.items() if file == name)


def raw_rows(path: Path) -> list[list[str]]:
    """An independent reading of the file (header included, BOM dropped)."""
    text = path.read_text(encoding="utf-8-sig")
    return list(csv.reader(io.StringIO(text, newline=""), delimiter="\t",
                           quoting=csv.QUOTE_NONE))


def test_every_glue_file_has_an_expected_count(glue_root):
    present = sorted(str(p.relative_to(glue_root)) for p in glue_root.glob("*/*.tsv"))
    assert present == sorted(EXAMPLE_COUNTS)


@pytest.mark.parametrize("relative", sorted(EXAMPLE_COUNTS))
def test_read_each_file_with_its_task_config(relative, glue_root):
    directory, name = relative.split("/")
    task = next(t for t, d in TASK_DIRS.items() if d == directory)
    cfg = task_config(task, glue_root)
    split = file_split(cfg, name)
    table = read_glue_file(
        glue_root / relative,
        columns=dict(cfg.columns),
        labels=list(cfg.labels) if cfg.labels is not None else None,
        has_header=split not in cfg.headerless_splits,
        headerless_columns=dict(cfg.headerless_columns) if cfg.headerless_columns else None,
        label_range=list(cfg.label_range) if cfg.label_range is not None else None,
    )
    count = EXAMPLE_COUNTS[relative]
    assert {key: len(values) for key, values in table.items()} == {
        key: count for key in table}
    assert ("text_b" in table) == (task in PAIR_TASKS)
    assert all(text.strip() for text in table["text_a"])
    if task in HAS_INDEX_COLUMN:
        assert table["idx"] == list(range(count))  # the files' index columns run 0..n-1

    # Labels against an independent reading of the label column.
    rows = raw_rows(glue_root / relative)
    if split in cfg.headerless_splits:
        position = cfg.headerless_columns.label
        raw_labels = [row[position] for row in rows]
    else:
        position = rows[0].index(cfg.columns.label)
        raw_labels = [row[position] for row in rows[1:]]
    assert len(raw_labels) == count
    if task == "stsb":
        assert table["label"] == [float(value) for value in raw_labels]
        assert all(0.0 <= score <= 5.0 for score in table["label"])
        assert min(table["label"]) == 0.0 and max(table["label"]) == 5.0
    else:
        assert set(raw_labels) == FILE_LABELS[task]
        names = list(cfg.labels)
        assert table["label"] == [names.index(value) for value in raw_labels]
        assert set(table["label"]) == {0, 1}


@pytest.mark.parametrize("task", sorted(TASK_DIRS))
def test_load_glue_splits_on_real_dirs(task, glue_root):
    splits = load_glue_splits(task_config(task, glue_root))
    directory = TASK_DIRS[task]
    expected = {"validation": EXAMPLE_COUNTS[f"{directory}/dev.tsv"]}
    # QNLI's train split is dev.tsv again (task.train_file), the others have train.tsv.
    expected["train"] = EXAMPLE_COUNTS.get(f"{directory}/train.tsv", expected["validation"])
    assert {split: table.num_rows for split, table in splits.items()} == expected
    for table in splits.values():
        columns = {"text_a", "idx", "label"} | ({"text_b"} if task in PAIR_TASKS else set())
        assert set(table.column_names) == columns


def test_rte_labels(glue_root):
    splits = load_glue_splits(task_config("rte", glue_root))
    # labels: [entailment, not_entailment]; counted in the file: 1249 / 1241
    assert Counter(splits["train"]["label"]) == {0: 1249, 1: 1241}
    assert set(splits["validation"]["label"]) == {0, 1}


def test_known_first_and_last_examples(glue_root):
    mrpc = load_glue_splits(task_config("mrpc", glue_root))["train"]
    assert mrpc[0]["label"] == 1
    assert mrpc[0]["text_a"].startswith('Amrozi accused his brother, whom he called "the witness"')
    assert mrpc[0]["text_b"].startswith('Referring to him as only "the witness", Amrozi')
    assert sum(mrpc["label"]) == 2474  # MRPC train: 2474 paraphrases of 3668

    cola = load_glue_splits(task_config("cola", glue_root))
    assert cola["train"][0]["text_a"] == (
        "Our friends won't buy this analysis, let alone the next one we propose.")
    assert cola["train"][0]["label"] == 1
    assert sum(cola["train"]["label"]) == 6023  # acceptable sentences in CoLA train
    # dev.tsv has no final newline: its last line is still the last example.
    assert not (glue_root / "CoLA/dev.tsv").read_bytes().endswith(b"\n")
    assert cola["validation"][-1]["text_a"] == "John talked to Bill about himself."

    stsb = load_glue_splits(task_config("stsb", glue_root))["train"]
    assert stsb[0]["text_a"] == "A plane is taking off."
    assert stsb[0]["text_b"] == "An air plane is taking off."
    assert stsb[0]["label"] == 5.0 and stsb[1]["label"] == pytest.approx(3.8)


def test_mrpc_files_start_with_a_bom(glue_root):
    for name in ("train.tsv", "dev.tsv"):
        assert (glue_root / "MRPC" / name).read_bytes().startswith(b"\xef\xbb\xbfQuality")


# Rows (header included) with csv's default quoting vs QUOTE_NONE, from SOURCES.md.
DEFAULT_QUOTING_ROWS = {"MRPC/train.tsv": (3571, 3669), "QNLI/dev.tsv": (5399, 5464),
                        "STS-B/train.tsv": (5712, 5750), "STS-B/dev.tsv": (1471, 1501)}


@pytest.mark.parametrize("relative", sorted(DEFAULT_QUOTING_ROWS))
def test_default_quoting_would_merge_rows(relative, glue_root):
    """The real files really need QUOTE_NONE: default quoting merges rows."""
    csv.field_size_limit(1 << 30)
    text = (glue_root / relative).read_text(encoding="utf-8-sig")
    default = sum(1 for _ in csv.reader(io.StringIO(text, newline=""), delimiter="\t"))
    quote_none = len(raw_rows(glue_root / relative))
    assert (default, quote_none) == DEFAULT_QUOTING_ROWS[relative]
    assert quote_none == EXAMPLE_COUNTS[relative] + 1

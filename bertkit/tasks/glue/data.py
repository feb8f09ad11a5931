"""A GLUE-like task's data: splits from the Hub or from local files, as TaskSplits with columns
text_a, text_b (pair tasks), label (class id or float; absent on unlabelled test splits), idx.
Below them, in the order they are used: the task's classes, the reader of GLUE files in their
original layout, and the embedded demo set (`make demo`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import datasets
from omegaconf import DictConfig, OmegaConf

from bertkit.data.atomic_files import read_utf8, write_text_atomic
from bertkit.data.task_data import SINGLE_FILE_KEYS, TaskSplits, load_hub_dataset, uses_local_files
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)


def is_test_split(split: str) -> bool:
    return split.startswith("test")


def is_validation_split(split: str) -> bool:
    return split.startswith("validation")


def local_split_files(task: DictConfig) -> dict[str, Path]:
    """Split name -> file: task.data_dir in the GLUE layout, then task.*_file on top.

    A single task.validation_file replaces every validation split of the layout (MNLI's two).
    """
    files: dict[str, Path] = {}
    if task.data_dir:
        data_dir = Path(task.data_dir)
        if not data_dir.is_dir():
            raise BertkitError(f"task.data_dir={data_dir}: no such directory")
        for split, name in task.files.items():
            path = data_dir / name
            # A split that a task.*_file replaces need not be in data_dir.
            override_key = SINGLE_FILE_KEYS.get(split.split("_")[0])
            overridden = bool(override_key and task[override_key])
            if path.is_file():
                files[split] = path
            elif not is_test_split(split) and not overridden:
                raise BertkitError(
                    f"task.data_dir={data_dir} has no {name} ({split} split of the original "
                    f"GLUE layout for {task.name}: {', '.join(task.files.values())})"
                )
    for split, key in SINGLE_FILE_KEYS.items():
        if task[key]:
            path = Path(task[key])
            if not path.is_file():
                raise BertkitError(f"task.{key}={path}: file not found")
            prefix = "validation" if split == "validation" else split
            for old in [s for s in files if s.startswith(prefix)]:
                del files[old]
            files[split] = path
    if "train" not in files:
        raise BertkitError(f"task {task.name}: no training file (task.data_dir or task.train_file)")
    if not any(is_validation_split(s) for s in files):
        raise BertkitError(
            f"task {task.name}: no validation file (task.data_dir or task.validation_file)"
        )
    return files


def _fingerprint(task: DictConfig, files: dict[str, Path]) -> str:
    """A content hash of the files and the reading rules, so cached tokenisation is reused
    by every run and sweep job that reads the same data, and never by one that does not."""
    digest = hashlib.sha256()
    reading = {k: task[k] for k in ("columns", "headerless_splits", "headerless_columns",
                                    "labels", "label_range", "skip_malformed_rows")}
    digest.update(json.dumps(OmegaConf.to_container(DictConfig(reading)), sort_keys=True).encode())
    for split, path in sorted(files.items()):
        digest.update(split.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def load_local_splits(task: DictConfig) -> TaskSplits:
    files = local_split_files(task)
    labels = file_labels(task)
    label_range = list(task.label_range) if task.label_range is not None else None
    columns = OmegaConf.to_container(task.columns)
    headerless = (OmegaConf.to_container(task.headerless_columns)
                  if task.headerless_columns else None)
    splits = {}
    for split, path in files.items():
        base_split = split.split("_")[0]
        table = read_glue_file(
            path,
            columns=columns,
            labels=labels,
            has_header=base_split not in task.headerless_splits,
            headerless_columns=headerless,
            label_range=label_range,
            need_label=not is_test_split(split),
            skip_malformed_rows=task.skip_malformed_rows,
        )
        splits[split] = datasets.Dataset.from_dict(table)
    fingerprint = _fingerprint(task, files)
    return TaskSplits(splits, {split: fingerprint for split in splits})


def _hub_class_ids(task: DictConfig, raw: datasets.DatasetDict, where: str) -> list[int] | None:
    """Hub class id -> the task's class id, through the class names: the dataset's own
    (a ClassLabel label column, as nyu-mll/glue has), else task.hub.labels. None: regression."""
    names = class_names(task)
    if names is None:
        return None
    feature = next(iter(raw.values())).features.get("label")
    hub_names = getattr(feature, "names", None)
    source = f"the label names of {where}"
    if hub_names is None:
        if task.hub.labels is None:
            raise BertkitError(f"{where} does not name its classes (no ClassLabel label "
                               f"column): set task.hub.labels to the class name of each id")
        hub_names, source = [str(name) for name in task.hub.labels], "task.hub.labels"
    unknown = [name for name in hub_names if name not in names]
    if unknown:
        raise BertkitError(f"{source} {list(hub_names)}: {unknown} not among the task's "
                           f"class names {names} (task.class_names)")
    return [names.index(name) for name in hub_names]


def load_hub_splits(task: DictConfig) -> TaskSplits:
    hub = task.hub
    where = f"the Hub dataset {hub.path}/{hub.name}"
    raw = load_hub_dataset(
        f"{where} for task {task.name}",
        f"give local files: task.data_dir=<dir with {', '.join(task.files.values())}>",
        hub.path, hub.name)
    text_a, text_b = hub.columns.text_a, hub.columns.text_b
    to_task_label = _hub_class_ids(task, raw, where)
    splits = {}
    for split, table in raw.items():
        columns = {"text_a": table[text_a], "idx": table["idx"]}
        if text_b:
            columns["text_b"] = table[text_b]
        hub_labels = table["label"]
        # GLUE test splits on the Hub carry label -1 (hidden).
        if not all(label == -1 for label in hub_labels):
            columns["label"] = (
                [to_task_label[label] for label in hub_labels] if to_task_label else hub_labels
            )
        splits[split] = datasets.Dataset.from_dict(columns)
    # The id mapping too: the cached features hold the mapped labels.
    fingerprint = hashlib.sha256(
        ("".join(raw[s]._fingerprint for s in sorted(raw)) + str(to_task_label)).encode()
    ).hexdigest()[:16]
    return TaskSplits(splits, {split: fingerprint for split in splits})


def load_glue_splits(task: DictConfig, data_source: str = "auto") -> TaskSplits:
    if uses_local_files(task, data_source):
        return load_local_splits(task)
    return load_hub_splits(task)


# ================================================================================================
# A GLUE task's classes under two spellings: task.labels, the strings its files and the GLUE
# leaderboard write ('0'/'1' for CoLA, SST-2, MRPC, QQP, WNLI), whose positions are the class
# ids; and task.class_names, what GLUE and nyu-mll/glue call those classes, which the saved
# model's id2label/label2id carry (and so the text-classification pipeline's labels).

def file_labels(task: DictConfig) -> list[str] | None:
    """Class id -> the files' label string; None for a regression task."""
    return [str(label) for label in task.labels] if task.labels is not None else None


def class_names(task: DictConfig) -> list[str] | None:
    """Class id -> its name (task.class_names, in the order of task.labels); None for a
    regression task."""
    labels = file_labels(task)
    names = task.class_names
    if labels is None:
        if names is not None:
            raise BertkitError(f"task.class_names={list(names)} but task.labels is null (a "
                               f"regression task has no classes): set task.class_names=null")
        return None
    if names is None:
        raise BertkitError(f"task.class_names is null for the classification task {task.name}: "
                           f"give one name per entry of task.labels {labels}")
    names = [str(name) for name in names]
    if len(names) != len(labels) or len(set(names)) != len(names):
        raise BertkitError(f"task.class_names={names}: expected {len(labels)} distinct names, "
                           f"one per entry of task.labels {labels}, in its order")
    return names


# ================================================================================================
# Reader for GLUE task files in their original layout, with the original processors' rules.
#
# Why not pandas / `datasets.load_dataset("csv")`: the GLUE files need QUOTE_NONE (fields start
# with a bare `"`), MRPC's BOM, CoLA's missing header on train/dev only, and every bad row must
# be reported with its file and line, which neither does.

# Raised well above the default (128 KiB): some MNLI/QNLI fields are long.
csv.field_size_limit(1 << 30)


def _column_positions(
    path: Path, header: Sequence[str] | None, columns: dict, headerless_columns: dict | None,
    need_label: bool,
) -> dict[str, int | None]:
    """Map text_a/text_b/label/index to field positions; label and index are optional."""
    if header is None:
        if not headerless_columns:
            raise BertkitError(f"{path}: no header, and task.headerless_columns is not set")
        positions = {key: headerless_columns.get(key) for key in ("text_a", "text_b", "label")}
        positions["index"] = None
        return positions
    positions: dict[str, int | None] = {}
    for key in ("text_a", "text_b", "label", "index"):
        name = columns.get(key)
        if name is None:
            positions[key] = None
        elif name in header:
            positions[key] = header.index(name)
        elif key == "index" or (key == "label" and not need_label):
            positions[key] = None
        else:
            raise BertkitError(
                f"{path}, line 1: no column {name!r} in the header (task.columns.{key}); "
                f"the header has: {', '.join(header)}"
            )
    return positions


def _parse_label(
    value: str, path: Path, line: int, labels: Sequence[str] | None,
    label_range: Sequence[float] | None,
) -> int | float:
    value = value.strip()
    if labels is None:
        try:
            score = float(value)
        except ValueError:
            raise BertkitError(
                f"{path}, line {line}: label {value!r} is not a number (regression task)"
            ) from None
        if label_range is not None and not label_range[0] <= score <= label_range[1]:
            raise BertkitError(
                f"{path}, line {line}: label {score} is outside task.label_range "
                f"[{label_range[0]}, {label_range[1]}]"
            )
        return score
    try:
        return list(labels).index(value)
    except ValueError:
        raise BertkitError(
            f"{path}, line {line}: label {value!r} is not one of the task's labels "
            f"{list(labels)} (task.labels)"
        ) from None


def read_glue_file(
    path: str | Path,
    *,
    columns: dict,
    labels: Sequence[str] | None,
    has_header: bool = True,
    headerless_columns: dict | None = None,
    label_range: Sequence[float] | None = None,
    need_label: bool = True,
    skip_malformed_rows: bool = False,
) -> dict[str, list]:
    """Read one GLUE tsv into columns text_a, text_b (pair tasks), label (if present) and idx.

    Labels become class ids (positions in `labels`) or floats (regression, `labels` None).
    `idx` is the file's index column where it has one, else the row's position.
    """
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"{path}: file not found")
    # Lines end at \n, \r\n or \r only, as with open() in the original processors;
    # str.splitlines() would also split inside fields at U+2028, U+0085, \x0c, \x1c-\x1e.
    text = io.StringIO(read_utf8(path), newline=None)
    rows = csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(rows, None) if has_header else None
    if has_header and header is None:
        raise BertkitError(f"{path}: the file is empty")
    positions = _column_positions(path, header, columns, headerless_columns, need_label)
    needed = max(p for p in positions.values() if p is not None)

    out: dict[str, list] = {"text_a": [], "idx": []}
    if positions["text_b"] is not None:
        out["text_b"] = []
    if positions["label"] is not None:
        out["label"] = []
    first_line = 2 if has_header else 1
    skipped = 0
    for line, row in enumerate(rows, start=first_line):
        if not row:
            continue
        if len(row) <= needed:
            if skip_malformed_rows:
                skipped += 1
                continue
            raise BertkitError(
                f"{path}, line {line}: {len(row)} tab-separated fields, expected at least "
                f"{needed + 1} (set task.skip_malformed_rows=true to skip such rows)"
            )
        out["text_a"].append(row[positions["text_a"]])
        if "text_b" in out:
            out["text_b"].append(row[positions["text_b"]])
        if "label" in out:
            out["label"].append(
                _parse_label(row[positions["label"]], path, line, labels, label_range)
            )
        index = positions["index"]
        out["idx"].append(int(row[index]) if index is not None and row[index].isdigit()
                          else len(out["idx"]))
    if skipped:
        logger.warning("%s: skipped %d malformed rows (task.skip_malformed_rows)", path, skipped)
    if not out["text_a"]:
        raise BertkitError(f"{path}: no examples")
    return out


# ================================================================================================
# The embedded demo set: generated, so that `make demo` needs neither the Hub nor ../shared.
#
# A sentence is filler words with a few cue words mixed in; its label is 1 when it holds more
# positive than negative cues. A small BERT learns this in a few hundred steps, so the demo
# shows a real learning curve. The vocabulary is whole words plus BERT's special tokens.

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["good", "great", "fine", "bright", "happy", "superb", "lovely", "warm"]
NEGATIVE = ["bad", "awful", "poor", "dull", "sad", "grim", "ugly", "cold"]
FILLER = [
    "the", "a", "film", "story", "actor", "plot", "scene", "music", "was", "is", "and", "but",
    "very", "quite", "with", "of", "in", "to", "it", "this", "that", "ending", "cast", "script",
    "director", "camera", "light", "night", "day", "city", "house", "road", "long", "short",
    "old", "new", "some", "many", "its", "their", "one", "two", "first", "last", "again",
]


def _sentence(rng: random.Random, min_words: int, max_words: int) -> tuple[str, int]:
    while True:
        words = rng.choices(FILLER, k=rng.randint(min_words, max_words))
        pos, neg = rng.randint(0, 4), rng.randint(0, 4)
        if pos != neg:
            break
    for cue in rng.choices(POSITIVE, k=pos) + rng.choices(NEGATIVE, k=neg):
        words.insert(rng.randrange(len(words) + 1), cue)
    return " ".join(words), int(pos > neg)


def write_demo_data(data_dir: str | Path, *, num_train: int, num_validation: int, num_test: int,
                    min_words: int, max_words: int, seed: int) -> Path:
    """Write train.tsv / dev.tsv / test.tsv (SST-2 layout) and vocab.txt; idempotent."""
    data_dir = Path(data_dir)
    rng = random.Random(seed)
    splits = {"train.tsv": num_train, "dev.tsv": num_validation, "test.tsv": num_test}
    for name, count in splits.items():
        examples = [_sentence(rng, min_words, max_words) for _ in range(count)]
        if name == "test.tsv":
            lines = ["index\tsentence"] + [f"{i}\t{text}" for i, (text, _) in enumerate(examples)]
        else:
            lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in examples]
        write_text_atomic(data_dir / name, "\n".join(lines) + "\n")
    vocab = SPECIAL_TOKENS + sorted(set(POSITIVE + NEGATIVE + FILLER))
    write_text_atomic(data_dir / "vocab.txt", "\n".join(vocab) + "\n")
    return data_dir


def ensure_demo_data(data_dir: str | Path, synthetic: dict) -> Path:
    data_dir = Path(data_dir)
    needed = ["train.tsv", "dev.tsv", "test.tsv", "vocab.txt"]
    if not all((data_dir / name).is_file() for name in needed):
        write_demo_data(data_dir, **synthetic)
    return data_dir

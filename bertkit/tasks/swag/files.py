"""SWAG examples from the release's CSV files (train.csv, val.csv) or the Hub, in one schema.

The schema: idx (the example's 0-based position in its split, its id in prediction files),
video_id, fold_ind, sent1, sent2, ending0..ending3, label (0-3). Why our own reader and not
`datasets.load_dataset("csv")` or pandas: some copies of the files start with an unnamed
index column, so columns are found by header name; and every bad row (wrong field count, a
label that is not 0-3, an empty ending) must be reported with its file, line and column.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import datasets

from bertkit.data.atomic_files import read_utf8
from bertkit.data.task_data import load_hub_dataset
from bertkit.errors import BertkitError

NUM_CHOICES = 4  # fixed by the format: ending0..ending3
ENDINGS = tuple(f"ending{k}" for k in range(NUM_CHOICES))
# Header names of the release (and the Hub's regular configuration) -> schema columns.
TEXT_COLUMNS = {"sent1": "sent1", "sent2": "sent2", **{e: e for e in ENDINGS}}
ID_COLUMNS = {"video-id": "video_id", "fold-ind": "fold_ind"}  # optional: written if present
REQUIRED = (*TEXT_COLUMNS, "label")
FEATURES = datasets.Features({
    "idx": datasets.Value("int64"),
    "video_id": datasets.Value("string"),
    "fold_ind": datasets.Value("string"),
    **{column: datasets.Value("string") for column in TEXT_COLUMNS.values()},
    "label": datasets.Value("int64"),
})

csv.field_size_limit(1 << 30)


def _label(value: str, path: Path, line: int) -> int:
    text = value.strip()
    if not text.lstrip("-").isdigit():
        raise BertkitError(f"{path}, line {line}, column 'label': {value!r} is not an integer; "
                           f"expected the index of the true ending, 0 to {NUM_CHOICES - 1}")
    label = int(text)
    if not 0 <= label < NUM_CHOICES:
        raise BertkitError(f"{path}, line {line}, column 'label': {label} is outside 0 to "
                           f"{NUM_CHOICES - 1} (the index of the true ending)")
    return label


def _header(path: Path, header: list[str] | None) -> dict[str, int]:
    """Column name -> position; the unnamed index column of some copies is ignored."""
    if header is None:
        raise BertkitError(f"{path}: the file is empty (expected a header line with "
                           f"{', '.join(REQUIRED)})")
    names = [name.strip() for name in header]
    positions: dict[str, int] = {}
    for position, name in enumerate(names):
        if name in positions and name in (*REQUIRED, *ID_COLUMNS):
            raise BertkitError(f"{path}, line 1: column {name!r} appears twice in the header")
        positions.setdefault(name, position)
    missing = [name for name in REQUIRED if name not in positions]
    if missing:
        raise BertkitError(
            f"{path}, line 1: no column {missing[0]!r} in the header"
            + (f" (nor {', '.join(repr(m) for m in missing[1:])})" if missing[1:] else "")
            + f"; expected the SWAG columns {', '.join(REQUIRED)}; the header has: "
            f"{', '.join(names)}"
        )
    return positions


def read_swag_csv(path: str | Path) -> datasets.Dataset:
    """Read train.csv / val.csv of the SWAG release (comma-separated, quoted fields), in file
    order. Line numbers in messages are those of the file (a quoted field may span lines)."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"{path}: file not found")
    # newline="": line ends inside quoted fields stay part of the field, as csv expects.
    reader = csv.reader(io.StringIO(read_utf8(path), newline=""))
    try:
        header = next(reader, None)
        positions = _header(path, header)
        columns: dict[str, list] = {name: [] for name in FEATURES}
        line = reader.line_num + 1  # the line the next record starts on
        for row in reader:
            if not row:  # a blank line
                line = reader.line_num + 1
                continue
            if len(row) != len(header):
                raise BertkitError(f"{path}, line {line}: {len(row)} comma-separated fields, "
                                   f"expected {len(header)} (as in the header)")
            for name in ENDINGS:
                if not row[positions[name]].strip():
                    raise BertkitError(f"{path}, line {line}, column {name!r}: empty ending")
            columns["idx"].append(len(columns["idx"]))
            for name, column in ID_COLUMNS.items():
                columns[column].append(row[positions[name]] if name in positions else "")
            for name, column in TEXT_COLUMNS.items():
                columns[column].append(row[positions[name]])
            columns["label"].append(_label(row[positions["label"]], path, line))
            line = reader.line_num + 1
    except csv.Error as err:  # e.g. a NUL byte, or a quote left open at the end of the file
        raise BertkitError(f"{path}, line {reader.line_num}: not valid CSV ({err})") from None
    if not columns["idx"]:
        raise BertkitError(f"{path}: no examples (a header and no rows)")
    return datasets.Dataset.from_dict(columns, features=FEATURES)


def swag_from_hub(path: str, name: str | None, split: str, files: dict) -> datasets.Dataset:
    """One split of the Hub's SWAG (allenai/swag, configuration "regular") in the schema, with a
    message that points to the release's CSV files when the Hub is out of reach."""
    where = f"{path}/{name}" if name else path
    table = load_hub_dataset(
        f"split {split!r} of the Hub dataset {where}",
        f"give the CSV files of the SWAG release: task.data_dir=<dir with {files['train']} and "
        f"{files['validation']}>, or task.train_file=<path to {files['train']}> "
        f"task.validation_file=<path to {files['validation']}>",
        path, name, split=split)
    missing = [column for column in REQUIRED if column not in table.column_names]
    if missing:
        raise BertkitError(f"the Hub dataset {where} ({split}) has no column(s) "
                           f"{', '.join(missing)}; expected the SWAG columns {', '.join(REQUIRED)}")
    labels = table["label"][:]
    bad = next((i for i, label in enumerate(labels) if not 0 <= label < NUM_CHOICES), None)
    if bad is not None:  # the Hub's test split hides its labels as -1
        raise BertkitError(f"the Hub dataset {where} ({split}), row {bad}: label {labels[bad]} "
                           f"is outside 0 to {NUM_CHOICES - 1} (an unlabelled split?)")
    columns = {"idx": list(range(len(table))), "label": labels}
    for hub_name, column in {**ID_COLUMNS, **TEXT_COLUMNS}.items():
        columns[column] = (table[hub_name][:] if hub_name in table.column_names
                           else [""] * len(table))
    return datasets.Dataset.from_dict(columns, features=FEATURES)

"""Reader for GLUE task files in their original layout, with the original processors' rules.

Why not pandas / `datasets.load_dataset("csv")`: the GLUE files need QUOTE_NONE (fields start
with a bare `"`), MRPC's BOM, CoLA's missing header on train/dev only, and every bad row must
be reported with its file and line, which neither does.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Sequence
from pathlib import Path

from bertkit.data.text_files import read_utf8
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

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

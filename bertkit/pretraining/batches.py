"""Pretraining batches of static shape, built from Arrow columns without per-example Python.

Shapes: every batch of a phase is padded to the phase's length (full-sentence packing fills it
already; sentence pairs are padded to it, as the plain way pads to max_seq_length), and its
masked positions are gathered into a fixed number of slots, the phase's
max_predictions_per_seq per sequence (Google's masked_lm_positions / masked_lm_weights): unused
slots point at position 0 with the label -100, which the loss weighs 0. So a phase is one shape,
compiled once, and the MLM head needs no data-dependent indexing (a host sync on a GPU).

Speed: Trainer's DataLoader takes a batch of rows from a dataset's `__getitems__`. ArrowRows
answers with the rows as one Arrow table (a take, about 1 ms for 256 rows), not as 256 Python
dicts of lists (8-11 ms); the collators pad its flat value arrays into matrices with one
vectorised assignment.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from bertkit.errors import BertkitError
from bertkit.pretraining.masking import IGNORE_INDEX

SLOT_POSITIONS, SLOT_LABELS = "mlm_positions", "mlm_labels"


class ArrowRows(torch.utils.data.Dataset):
    """A datasets.Dataset whose batches of rows come as one Arrow table.

    `__getitems__` returns a one-element list holding the table: DataLoader hands what it returns
    to the collator as it is, and Trainer's column-removing wrapper passes on anything that is
    not a dict. `__getitem__` (one row, as a dict) serves everything else.
    """

    def __init__(self, dataset: datasets.Dataset):
        self.dataset = dataset
        self._table = dataset.with_format("arrow")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[pa.Table]:
        return [self._table[list(indices)]]


class Columns:
    """A batch's columns, from an Arrow table (ArrowRows) or from a list of feature dicts
    (streamed or hand-made batches): sequence columns as flat values with row lengths, scalar
    columns as vectors."""

    def __init__(self, features):
        if len(features) == 1 and isinstance(features[0], pa.Table):
            self._table, self._features = features[0], None
            self.names = set(self._table.column_names)
        else:
            self._table, self._features = None, list(features)
            self.names = set(self._features[0]) if self._features else set()
        self._ids = self.ragged("input_ids")  # read once: the lengths and the padded ids
        self.lengths = self._ids[1]

    def __len__(self) -> int:
        return len(self.lengths)

    def ragged(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(all rows' values concatenated, each row's length)."""
        if self._table is not None:
            column = self._table.column(name)
            return (pc.list_flatten(column).to_numpy().astype(np.int64, copy=False),
                    pc.list_value_length(column).to_numpy().astype(np.int64, copy=False))
        rows = [np.asarray(feature[name], dtype=np.int64) for feature in self._features]
        return np.concatenate(rows), np.array([len(row) for row in rows], dtype=np.int64)

    def vector(self, name: str) -> np.ndarray:
        if self._table is not None:
            return self._table.column(name).to_numpy().astype(np.int64, copy=False)
        return np.array([feature[name] for feature in self._features], dtype=np.int64)

    def padded(self, name: str, width: int, fill: int) -> np.ndarray:
        values, lengths = self._ids if name == "input_ids" else self.ragged(name)
        return pad_rows(values, lengths, width, fill)


def pad_rows(values: np.ndarray, lengths: np.ndarray, width: int, fill: int) -> np.ndarray:
    """[rows, width], row i holding its lengths[i] values (in the order given) then `fill`."""
    out = np.full((len(lengths), width), fill, dtype=np.int64)
    out[np.arange(width)[None, :] < lengths[:, None]] = values
    return out


def slots_of(chosen: np.ndarray, ids: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, labels), each [rows, slots]: row i's chosen positions in order, then 0 with
    the label -100 in the unused slots."""
    rows, columns = np.nonzero(chosen)
    counts = chosen.sum(axis=1)
    if counts.size and counts.max() > slots:
        raise BertkitError(f"a sequence has {int(counts.max())} masked positions, more than "
                           f"masking.max_predictions_per_seq={slots} of its phase (static "
                           f"masks built with other settings?)")
    starts = np.cumsum(counts) - counts
    index = np.arange(len(rows)) - np.repeat(starts, counts)
    positions = np.zeros((len(chosen), slots), dtype=np.int64)
    labels = np.full((len(chosen), slots), IGNORE_INDEX, dtype=np.int64)
    positions[rows, index] = columns
    labels[rows, index] = ids[rows, columns]
    return positions, labels


class PhaseShapes:
    """The width and slot count of a batch: the shortest phase whose length holds the batch's
    longest row, and that phase's predictions per sequence (the most of any rule up to it).

    static=False (a CPU without compile, where padding is compute paid for nothing and shapes
    are free): the batch's longest row, rounded up to pad_to_multiple_of, instead of the
    phase's length; the slots stay the phase's."""

    def __init__(self, phases: Sequence[tuple[int | None, int]], pad_to_multiple_of=None,
                 static: bool = True):
        """phases: (length, max_predictions_per_seq) by increasing length; a length of None
        (one rule for any length) pads each batch to its longest row instead."""
        self.phases = list(phases)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.static = static

    def phase(self, longest: int) -> tuple[int | None, int]:
        for index, (length, _) in enumerate(self.phases):
            if length is None or longest <= length:
                slots = max(predictions for _, predictions in self.phases[:index + 1])
                return length, slots
        raise BertkitError(f"a pretraining instance of {longest} tokens is longer than the "
                           f"longest phase ({self.phases[-1][0]} tokens)")

    def shape(self, longest: int) -> tuple[int, int]:
        """(width, slots) of a batch whose longest row has `longest` tokens."""
        length, slots = self.phase(longest)
        if length is None or not self.static:
            multiple = self.pad_to_multiple_of or 1
            width = -(-longest // multiple) * multiple
            return (width if length is None else min(width, length)), slots
        return length, slots


def model_batch(columns: Columns, ids: np.ndarray, positions: np.ndarray,
                labels: np.ndarray) -> dict[str, torch.Tensor]:
    """The model's inputs (the trainer drops the attention mask of a batch without padding
    where that pays: bertkit.training.trainer)."""
    width = ids.shape[1]
    batch = {"input_ids": torch.from_numpy(ids),
             SLOT_POSITIONS: torch.from_numpy(positions), SLOT_LABELS: torch.from_numpy(labels)}
    if "token_type_ids" in columns.names:
        batch["token_type_ids"] = torch.from_numpy(columns.padded("token_type_ids", width, 0))
    if "next_sentence_label" in columns.names:
        batch["next_sentence_label"] = torch.from_numpy(columns.vector("next_sentence_label"))
    mask = np.arange(width)[None, :] < columns.lengths[:, None]
    batch["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
    return batch


def per_position_labels(batch: dict) -> torch.Tensor:
    """[rows, width] labels (-100 where nothing is predicted) from a batch's slots: the layout
    of transformers' MLM labels, for reading a batch."""
    ids = batch["input_ids"]
    labels = torch.full_like(ids, IGNORE_INDEX)
    used = batch[SLOT_LABELS] != IGNORE_INDEX
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(used)
    labels[rows[used], batch[SLOT_POSITIONS][used]] = batch[SLOT_LABELS][used]
    return labels

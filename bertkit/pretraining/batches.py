"""Pretraining batches of static shape, built from Arrow columns without per-example Python,
and the order they are drawn in: the paper's sequence-length phases (PhasedSampler, below).

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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import Sampler
from transformers.trainer_pt_utils import get_length_grouped_indices

from bertkit.errors import BertkitError

SLOT_POSITIONS, SLOT_LABELS = "mlm_positions", "mlm_labels"

IGNORE_INDEX = -100  # the label torch's cross-entropy skips (no prediction there)


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


# The order in which pretraining sees its instances: the paper's sequence-length phases.
#
# BERT trains 90% of its steps on sequences of 128 tokens and the last 10% on 512 (Devlin et
# al. 2019, A.2), in one learning-rate schedule. The instances of both lengths sit in one
# dataset; this sampler draws the first phase's share of the run from the first part, then the
# second's from the second part, each pass over a part reshuffled. One Trainer run, so the
# schedule, the logs and resumption are continuous across the switch.
#
# The order within a phase is a plain shuffle, as Google's code draws it, wherever batches have
# their phase's length anyway (a GPU, or compiled: bertkit.training.trainer) or are packed
# (bertkit.pretraining.padding_free). Only on an eager CPU, where a batch is padded to its longest
# row and shapes are free, is each pass grouped by length (short instances together, so little
# compute goes to padding): batches then hold instances of similar length rather than a random
# draw of lengths, the gradient of each step is the mean over a less varied batch (the same
# instances over a pass).


@dataclass(frozen=True)
class Phase:
    offset: int          # where the phase's instances start in the concatenated dataset
    lengths: Sequence[int]
    num_samples: int     # instances the phase feeds to the model (all processes together)


def phase_steps(max_steps: int, long_share: float) -> tuple[int, int]:
    """Optimizer steps of the short and the long phase."""
    long_steps = int(round(max_steps * long_share))
    return max_steps - long_steps, long_steps


class PhasedSampler(Sampler[int]):
    """Yields indices phase after phase; lazily, since 1M steps x 256 is 256M indices.

    group_by_length: consecutive runs of `batch_size` indices have similar lengths (an eager
    CPU's order); else a plain shuffle. Deterministic for a seed, which is what Trainer needs
    to skip the consumed batches on resumption.
    """

    def __init__(self, phases: Sequence[Phase], batch_size: int, seed: int,
                 group_by_length: bool = True):
        self.phases = [phase for phase in phases if phase.num_samples > 0]
        self.batch_size = batch_size
        self.seed = seed
        self.group_by_length = group_by_length

    def __len__(self) -> int:
        return sum(phase.num_samples for phase in self.phases)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        for phase in self.phases:
            remaining = phase.num_samples
            while remaining > 0:
                order = get_length_grouped_indices(phase.lengths, self.batch_size,
                                                   generator=generator) \
                    if self.group_by_length else \
                    torch.randperm(len(phase.lengths), generator=generator).tolist()
                for index in order[:remaining]:
                    yield phase.offset + index
                remaining -= min(remaining, len(order))

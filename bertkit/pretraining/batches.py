"""Pretraining batches of static shape, built from Arrow columns without per-example Python,
and the order they are drawn in: the paper's sequence-length phases (PhasedSampler, below);
or padding-free (the last section: PackedBatches, packed_batch and the attention that keeps
each sequence to itself), the other way a batch of a phase is laid out.

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

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.nn import functional
from torch.utils.data import Sampler
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.trainer_pt_utils import BatchRebalanceSampler, get_length_grouped_indices

from bertkit.errors import BertkitError
from bertkit.training.trainer import SEQUENCE_LENGTHS

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
# (bertkit.pretraining.batches). Only on an eager CPU, where a batch is padded to its longest
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


# ================================================================================================
# Padding-free pretraining batches (pretraining.padding_free): the sequences of a batch laid
# end to end in a fixed token budget, each attending only to itself.
#
# Why: BERT's sentence pairs are shorter than their phase's length and padded to it, so 13 % of
# the positions of a WikiText-2 batch at 128 tokens are padding: compute spent on nothing.
# MosaicBERT and ModernBERT remove the padding and run variable-length attention over the packed
# tokens; NVIDIA's MLPerf BERT packs samples. Here, with BERT's recipe unchanged:
#
# - PackedBatches, the batch sampler, draws a phase's instances in a plain shuffle (as Google's
#   code does, no grouping by length) and fills each micro-batch up to its PackShape: a token
#   budget of batch size x the phase's length, a number of sequence slots and the phase's
#   masked-token slots. When the next instance does not fit, the next few in the order that do
#   fill the end; the ones passed over keep their place at the head of the next batch.
# - packed_batch lays a batch's sequences end to end in one row of the budget: positions restart
#   at each sequence, token types are kept, each sequence's length fills a sequence slot (NSP or
#   SOP is scored on each sequence's [CLS]), and the masked positions are gathered into the
#   phase's slots, as in a padded batch.
# - padding_free_attention (registered as an attention implementation with transformers'
#   AttentionInterface; BertModel hands it `cu_seq_lens_q` and `max_length_q`) keeps each
#   sequence to itself: PyTorch's variable-length FlashAttention (torch.nn.attention.varlen) on a
#   GPU in half precision when nothing is dropped (the kernel has no dropout: BERT's attention
#   dropout of 0.1 keeps the other path while training), otherwise the same attention sequence by
#   sequence: queries, keys and values gathered into a [sequence slots, phase length] layout,
#   SDPA with the padding masked (and the dropout), the result scattered back.
#
# Every shape is fixed per phase (the budget, the slots), so compile and CUDA graphs apply. On
# the same sequences the losses and gradients are the padded batch's
# (tests/pretraining/test_padding_free.py).

SETTINGS = ("auto", True, False)  # pretraining.padding_free's choices (config_schema)
ATTENTION = "bertkit_padding_free"  # the attention implementation's registered name
MAX_LENGTH = "max_sequence_length"  # the key of a packed batch: its phase's length (an int)


def padding_free_wanted(setting, attention_dropout: float) -> bool:
    """pretraining.padding_free: true or false as given. auto: on where PyTorch's
    variable-length kernel runs the training step, a GPU with no attention dropout (the kernel
    has none), so that no layer computes a padding position; off elsewhere. With BERT's
    attention dropout a GPU step takes the sequence-by-sequence attention, whose gathers and
    spare slots may cost what the padding saved: not on by default until a GPU measures it
    (docs/speed.md, "Padding-free pretraining"). On a CPU eager batches are padded to their
    longest row only and grouped by length, so little of them is padding."""
    if setting in (True, False):
        return setting
    return torch.cuda.is_available() and attention_dropout == 0 and _varlen_kernel() is not None


@dataclass(frozen=True)
class PackShape:
    """One phase's packed batch."""

    length: int       # the phase's max_seq_length: no sequence is longer
    tokens: int       # the token budget: batch size x length
    sequences: int    # sequence slots
    predictions: int  # masked-token slots: batch size x the phase's max_predictions_per_seq


def pack_shapes(phases: Sequence[tuple[int, int, float]], batch_size: int,
                headroom: float) -> list[PackShape]:
    """phases: (max_seq_length, max_predictions_per_seq, the mean length of its instances) by
    increasing length. Sequence slots: as many as the budget holds of sequences of the mean
    length, times `headroom` (pretraining.sequence_slot_headroom), at least batch_size. Slots
    too few leave padding (a batch ends when they are full); each slot costs the
    sequence-by-sequence attention a block of length x length."""
    return [PackShape(length, batch_size * length,
                      max(batch_size, math.ceil(batch_size * length / mean * headroom)),
                      batch_size * predictions) for length, predictions, mean in phases]


@dataclass(frozen=True)
class PackingPlan:
    """What PackedBatches needs beside the phases: each phase's PackShape and its instances'
    most masked tokens (bertkit.pretraining.masking.most_predictions)."""

    shapes: list[PackShape]
    predictions: list[np.ndarray]


# -- The order: packed micro-batches ---------------------------------------------------------


class _Order:
    """A phase's instances in plain shuffled passes, a new pass when one ends; the instances a
    batch passed over wait at the head."""

    def __init__(self, count: int, generator: torch.Generator):
        self.count, self.generator = count, generator
        self.waiting = np.zeros(0, dtype=np.int64)  # passed over, in order, then the pass
        self.passes = np.zeros(0, dtype=np.int64)
        self.position = 0

    def upcoming(self, number: int) -> np.ndarray:
        while len(self.waiting) + len(self.passes) - self.position < number:
            shuffled = torch.randperm(self.count, generator=self.generator).numpy()
            self.passes = np.concatenate([self.passes[self.position:], shuffled])
            self.position = 0
        ahead = number - len(self.waiting)
        return np.concatenate([self.waiting, self.passes[self.position:self.position + ahead]])

    def take(self, upcoming: np.ndarray, taken: np.ndarray) -> None:
        """Consumes `taken` (sorted indices into `upcoming`); the ones before the last taken
        and not taken wait for the next batch."""
        last = int(taken[-1]) + 1
        passed = np.ones(last, dtype=bool)
        passed[taken] = False
        consumed_from_pass = max(0, last - len(self.waiting))
        self.waiting = np.concatenate([upcoming[:last][passed],
                                       self.waiting[last:] if last < len(self.waiting)
                                       else np.zeros(0, dtype=np.int64)])
        self.position += consumed_from_pass


class PackedBatches(BatchRebalanceSampler):
    """The micro-batches of a padding-free run: lists of dataset indices, phase after phase,
    each within its phase's PackShape. Deterministic for a seed (what Trainer needs to skip the
    consumed batches on resumption), lazy (one pass of a phase's order is held at a time).

    A subclass of transformers' BatchRebalanceSampler for one reason: it is the type Trainer's
    DataLoader takes as a batch sampler (batches of a variable number of rows) and leaves the
    split over processes to; its rebalancing is not used. Every process computes every batch
    and keeps every world_size-th one."""

    # How far past the first instance that does not fit a batch looks for ones that do.
    LOOKAHEAD = 64

    def __init__(self, phases: Sequence[Phase], shapes: Sequence[PackShape],
                 predictions: Sequence[np.ndarray], batches: Sequence[int], seed: int,
                 rank: int = 0, world_size: int = 1):
        """predictions: each phase's instances' most masked tokens (masking.most_predictions);
        batches: each phase's micro-batches over all processes."""
        # BatchRebalanceSampler.__init__ is not called: its state is its rebalancing's.
        self.phases = [np.asarray(phase.lengths, dtype=np.int64) for phase in phases]
        self.offsets = [phase.offset for phase in phases]
        self.shapes, self.predictions = list(shapes), [np.asarray(p) for p in predictions]
        self.batches, self.seed = list(batches), seed
        self.rank, self.world_size = rank, world_size
        for lengths, shape in zip(self.phases, self.shapes, strict=True):
            if len(lengths) and lengths.max() > shape.length:
                raise BertkitError(f"a pretraining instance of {int(lengths.max())} tokens is "
                                   f"longer than its phase ({shape.length} tokens)")

    def __len__(self) -> int:
        return len(range(self.rank, sum(self.batches), self.world_size))  # numbered across phases

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        number = 0
        for lengths, offset, shape, predictions, count in zip(
                self.phases, self.offsets, self.shapes, self.predictions, self.batches,
                strict=True):
            if count == 0 or len(lengths) == 0:
                continue
            order = _Order(len(lengths), generator)
            for _ in range(count):
                batch = self._next_batch(order, lengths, predictions, shape)
                if number % self.world_size == self.rank:
                    yield [offset + int(index) for index in batch]
                number += 1

    def _next_batch(self, order: _Order, lengths: np.ndarray, predictions: np.ndarray,
                    shape: PackShape) -> np.ndarray:
        upcoming = order.upcoming(min(shape.sequences, len(lengths)) + self.LOOKAHEAD)
        tokens, masked = lengths[upcoming], predictions[upcoming]
        # The longest run of the order that fits, in one vectorised step ...
        fits = min(int(np.searchsorted(np.cumsum(tokens), shape.tokens, side="right")),
                   int(np.searchsorted(np.cumsum(masked), shape.predictions, side="right")),
                   shape.sequences)
        taken = list(range(fits))
        used, predicted = int(tokens[:fits].sum()), int(masked[:fits].sum())
        smallest = int(lengths.min())
        # ... then the next few that fit fill the end.
        for index in range(fits, min(len(upcoming), fits + self.LOOKAHEAD)):
            if len(taken) == shape.sequences or shape.tokens - used < smallest:
                break
            if used + tokens[index] <= shape.tokens and \
                    predicted + masked[index] <= shape.predictions:
                taken.append(index)
                used += int(tokens[index])
                predicted += int(masked[index])
        taken = np.asarray(taken, dtype=np.int64)
        order.take(upcoming, taken)
        return upcoming[taken]


# -- The batch: sequences end to end ---------------------------------------------------------


def packed_batch(columns: Columns, masked: np.ndarray, chosen: np.ndarray,
                 original: np.ndarray, shapes: Sequence[PackShape],
                 pad_id: int) -> dict:
    """The model's inputs of a packed batch, from its sequences masked in the padded layout
    ([sequences, longest]: the masked ids fed, the chosen positions, the original ids), in the
    smallest PackShape that holds them."""
    lengths = columns.lengths
    rows = np.arange(masked.shape[1])[None, :] < lengths[:, None]
    total, count = int(lengths.sum()), len(lengths)
    chosen_count = int(chosen[rows].sum())
    shape = next((shape for shape in shapes if lengths.max() <= shape.length
                  and total <= shape.tokens and count <= shape.sequences
                  and chosen_count <= shape.predictions), None)
    if shape is None:
        raise BertkitError(f"a padding-free batch of {count} sequences, {total} tokens and "
                           f"{chosen_count} masked tokens fits no phase's budget "
                           f"({', '.join(map(str, shapes))})")

    def flat(values: np.ndarray, fill: int) -> np.ndarray:
        out = np.full((1, shape.tokens), fill, dtype=np.int64)
        out[0, :total] = values
        return out

    ids = flat(masked[rows], pad_id)
    positions, labels = slots_of(flat(chosen[rows], 0).astype(bool), flat(original[rows], pad_id),
                                 shape.predictions)
    starts = np.cumsum(lengths) - lengths
    sequence_lengths = np.zeros(shape.sequences, dtype=np.int64)
    sequence_lengths[:count] = lengths
    batch = {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(flat(np.arange(total) - np.repeat(starts, lengths), 0)),
        SEQUENCE_LENGTHS: torch.from_numpy(sequence_lengths),
        MAX_LENGTH: shape.length,
        "mlm_positions": torch.from_numpy(positions),
        "mlm_labels": torch.from_numpy(labels),
    }
    if "token_type_ids" in columns.names:
        batch["token_type_ids"] = torch.from_numpy(flat(columns.ragged("token_type_ids")[0], 0))
    if "next_sentence_label" in columns.names:
        sentence = np.full(shape.sequences, IGNORE_INDEX, dtype=np.int64)
        sentence[:count] = columns.vector("next_sentence_label")
        batch["next_sentence_label"] = torch.from_numpy(sentence)
    return batch


# -- Attention: each sequence to itself -------------------------------------------------------


def sequence_boundaries(sequence_lengths: torch.Tensor, tokens: int,
                        max_length: int) -> torch.Tensor:
    """cu_seq_lens: the start of each sequence slot, then of each piece (at most max_length
    tokens) of the padding after the last sequence, then `tokens`: every position belongs to
    one block, so no kernel leaves a position's output undefined. Fixed size for a shape."""
    ends = torch.cumsum(sequence_lengths, 0)
    pieces = -(-tokens // max_length)
    padding = (ends[-1] + max_length * torch.arange(1, pieces + 1, device=ends.device)
               ).clamp(max=tokens)
    zero = torch.zeros(1, dtype=ends.dtype, device=ends.device)
    return torch.cat([zero, ends, padding]).to(torch.int32)


def _varlen_kernel():
    """torch.nn.attention.varlen.varlen_attn, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _by_sequence(query, key, value, boundaries, sequences: int, width: int, dropout: float,
                 scaling: float | None) -> torch.Tensor:
    """Each of the first `sequences` blocks' attention in a padded [block, width] layout (the
    padding positions after the last sequence get zeros: no loss reads them). [tokens, heads,
    head size] in and out."""
    tokens = query.shape[0]
    starts = boundaries[:sequences].to(torch.int64)
    lengths = boundaries[1:sequences + 1].to(torch.int64) - starts
    offsets = torch.arange(width, device=query.device)
    inside = offsets[None, :] < lengths[:, None]
    index = torch.where(inside, starts[:, None] + offsets[None, :], 0)

    def blocks(states):  # [blocks, heads, width, head size]; index_select's backward is an
        # index_add, cheaper on a CPU than advanced indexing's accumulating index_put
        return states.index_select(0, index.flatten()).unflatten(0, index.shape).transpose(1, 2)

    # An empty slot keeps one key, so that no softmax row is empty (NaN); its output is dropped.
    keep = inside.clone()
    keep[:, 0] = True
    out = functional.scaled_dot_product_attention(
        blocks(query), blocks(key), blocks(value), attn_mask=keep[:, None, None, :],
        dropout_p=dropout, scale=scaling).transpose(1, 2)
    # Scattered back; the positions outside a sequence go to one spare row, cut off after.
    target = torch.where(inside, index, tokens).flatten()
    flat = torch.zeros((tokens + 1, *query.shape[1:]), dtype=out.dtype, device=out.device)
    return flat.index_add(0, target, out.flatten(0, 1))[:tokens]


def padding_free_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                           scaling: float | None = None, **kwargs):
    """transformers' attention function signature; [1, heads, tokens, head size] in,
    [1, tokens, heads, head size] out. A batch without cu_seq_lens_q (a padded one: the
    held-out sets) goes to SDPA as the model's own attention would."""
    boundaries = kwargs.get("cu_seq_lens_q")
    if boundaries is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    width = kwargs["max_length_q"]
    q, k, v = (states[0].transpose(0, 1) for states in (query, key, value))
    varlen = _varlen_kernel()
    if dropout == 0.0 and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) \
            and varlen is not None:
        out = varlen(q, k, v, boundaries, boundaries, width, width, scale=scaling)
    else:
        out = _by_sequence(q, k, v, boundaries, kwargs["sequence_slots"], width, dropout,
                           scaling)
    return out[None], None


def register_attention() -> None:
    """The implementation's name for transformers (idempotent); a padded batch's mask is
    built as SDPA's."""
    AttentionInterface.register(ATTENTION, padding_free_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def attention_inputs(sequence_lengths: torch.Tensor, tokens: int, max_length: int) -> dict:
    """The keyword arguments BertModel passes on to padding_free_attention."""
    boundaries = sequence_boundaries(sequence_lengths, tokens, max_length)
    return {"cu_seq_lens_q": boundaries, "cu_seq_lens_k": boundaries,
            "max_length_q": max_length, "max_length_k": max_length,
            "sequence_slots": sequence_lengths.shape[0]}

"""Padding-free pretraining batches (pretraining.padding_free): the sequences of a batch laid
end to end in a fixed token budget, each attending only to itself.

Why: BERT's sentence pairs are shorter than their phase's length and padded to it, so 13 % of
the positions of a WikiText-2 batch at 128 tokens are padding: compute spent on nothing.
MosaicBERT and ModernBERT remove the padding and run variable-length attention over the packed
tokens; NVIDIA's MLPerf BERT packs samples. Here, with BERT's recipe unchanged:

- PackedBatches, the batch sampler, draws a phase's instances in a plain shuffle (as Google's
  code does, no grouping by length) and fills each micro-batch up to its PackShape: a token
  budget of batch size x the phase's length, a number of sequence slots and the phase's
  masked-token slots. When the next instance does not fit, the next few in the order that do
  fill the end; the ones passed over keep their place at the head of the next batch.
- packed_batch lays a batch's sequences end to end in one row of the budget: positions restart
  at each sequence, token types are kept, each sequence's length fills a sequence slot (NSP or
  SOP is scored on each sequence's [CLS]), and the masked positions are gathered into the
  phase's slots, as in a padded batch.
- padding_free_attention (registered as an attention implementation with transformers'
  AttentionInterface; BertModel hands it `cu_seq_lens_q` and `max_length_q`) keeps each
  sequence to itself: PyTorch's variable-length FlashAttention (torch.nn.attention.varlen) on a
  GPU in half precision when nothing is dropped (the kernel has no dropout: BERT's attention
  dropout of 0.1 keeps the other path while training), otherwise the same attention sequence by
  sequence: queries, keys and values gathered into a [sequence slots, phase length] layout,
  SDPA with the padding masked (and the dropout), the result scattered back.

Every shape is fixed per phase (the budget, the slots), so compile and CUDA graphs apply. On
the same sequences the losses and gradients are the padded batch's
(tests/pretraining/test_padding_free.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.trainer_pt_utils import BatchRebalanceSampler

from bertkit.errors import BertkitError
from bertkit.pretraining.batches import IGNORE_INDEX, Columns, Phase, slots_of
from bertkit.training.trainer import SEQUENCE_LENGTHS

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

"""Dynamic masking (RoBERTa): a fresh mask each time a sequence is fed to the model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DataCollatorForTokenClassification, PreTrainedTokenizerBase

from bertkit.pretraining.batches import Columns, PhaseShapes, model_batch, slots_of
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    MaskingRule,
    Vocabulary,
    candidates_and_budgets,
    mask_sequence,
    replace_chosen,
)
from bertkit.pretraining.padding_free import PackShape, packed_batch


def padding_collator(tokenizer: PreTrainedTokenizerBase, pad_to_multiple_of: int | None):
    """Pads input_ids and the other inputs, and `labels` with -100 (the held-out sets' collator).

    DataCollatorForTokenClassification is exactly that (its name aside): per-position labels
    padded with the index the loss ignores.
    """
    return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


class StaticShapeCollator:
    """Pads a batch to its phase's length and gathers its masked positions into the phase's
    slots (bertkit.pretraining.batches); subclasses choose the masked positions."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 phases: Sequence[tuple[int | None, int]], pad_to_multiple_of: int | None = None,
                 static: bool = True, packed: Sequence[PackShape] | None = None):
        """static=False: each batch padded to its longest row (PhaseShapes). packed: the
        phases' shapes of padding-free batches (bertkit.pretraining.padding_free), the
        sequences masked as in a padded batch, then laid end to end."""
        self.vocab = Vocabulary.from_tokenizer(tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self.shapes = PhaseShapes(phases, pad_to_multiple_of, static)
        self.packed = None if packed is None else list(packed)

    def __call__(self, features) -> dict:
        columns = Columns(features)
        longest = int(columns.lengths.max())
        if self.packed is not None:
            masked, chosen, original = self.mask(
                columns, columns.padded("input_ids", longest, self.pad_id))
            return packed_batch(columns, masked, chosen, original, self.packed, self.pad_id)
        width, slots = self.shapes.shape(longest)
        ids = columns.padded("input_ids", width, self.pad_id)
        masked, chosen, original = self.mask(columns, ids)
        positions, labels = slots_of(chosen, original, slots)
        return model_batch(columns, masked, positions, labels)

    def mask(self, columns: Columns, ids: np.ndarray):
        """(the input ids fed, the chosen positions, the original ids)."""
        raise NotImplementedError


class StaticMasksCollator(StaticShapeCollator):
    """Static masking's batches: the masks drawn in preprocessing (input_ids masked, `labels`
    holding the originals), read as arrays."""

    def mask(self, columns, ids):
        labels = columns.padded("labels", ids.shape[1], IGNORE_INDEX)
        chosen = labels != IGNORE_INDEX
        return ids, chosen, np.where(chosen, labels, ids)


class DynamicMaskingCollator(StaticShapeCollator):
    """Masks each example as its batch is built.

    The generator is seeded from torch's RNG at every batch: Trainer seeds that RNG (and gives
    each DataLoader worker its own), so runs are reproducible and workers never repeat masks.
    Token masking runs on the padded batch as a whole (a random key per position, the lowest
    `budget` keys of each row chosen): the same distribution as mask_sequence, without its
    per-sequence Python. Whole-word and span masking go sequence by sequence.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 rules: MaskingRule | Sequence[tuple[int, MaskingRule]],
                 pad_to_multiple_of: int | None = None, static: bool = True,
                 packed: Sequence[PackShape] | None = None):
        """rules: one rule, or (longest sequence, rule) pairs by increasing length, e.g. the
        paper's phases: 20 predictions up to 128 tokens, 80 up to 512."""
        self.rules = [(None, rules)] if isinstance(rules, MaskingRule) else list(rules)
        if len({rule.convention for _, rule in self.rules}) > 1:
            raise ValueError("one masking.convention for every phase of a collator")
        super().__init__(tokenizer, [(length, rule.max_predictions_per_seq)
                                     for length, rule in self.rules], pad_to_multiple_of, static,
                         packed)

    def rule_for(self, length: int) -> MaskingRule:
        for longest, rule in self.rules:
            if longest is None or length <= longest:
                return rule
        return self.rules[-1][1]

    def mask(self, columns, ids):
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        rules = [self.rule_for(int(length)) for length in columns.lengths]
        if all(rule.unit == "token" for rule in rules):
            return self._mask_tokens(ids, rules, rng)
        masked = np.full_like(ids, self.pad_id)
        labels = np.full_like(ids, IGNORE_INDEX)
        for row, (length, rule) in enumerate(zip(columns.lengths, rules, strict=True)):
            masked[row, :length], labels[row, :length] = mask_sequence(
                ids[row, :length], self.vocab, rule, rng)
        return masked, labels != IGNORE_INDEX, ids

    def _mask_tokens(self, ids: np.ndarray, rules: list[MaskingRule], rng: np.random.Generator):
        candidates, budget = candidates_and_budgets(ids, self.vocab, rules)  # never padding
        keys = rng.random(ids.shape)
        keys[~candidates] = 2.0  # after every candidate
        chosen = _lowest(keys, budget)
        column = np.array([[rule.mask_token_fraction, rule.random_token_fraction]
                           for rule in rules])
        masked = replace_chosen(ids, chosen, self.vocab, column[:, :1], column[:, 1:], rng,
                                rules[0].convention)
        return masked, chosen, ids


def _lowest(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """[rows, width] bool: each row's counts[i] lowest keys. A partition to the most any row
    takes, then a sort of those few: the same choice as ranking whole rows, at a fraction of
    the cost."""
    most = int(counts.max()) if counts.size else 0
    chosen = np.zeros(keys.shape, dtype=bool)
    if most == 0:
        return chosen
    candidates = np.argpartition(keys, most - 1, axis=1)[:, :most] \
        if most < keys.shape[1] else np.argsort(keys, axis=1)
    order = np.take_along_axis(keys, candidates, axis=1).argsort(axis=1)
    candidates = np.take_along_axis(candidates, order, axis=1)
    np.put_along_axis(chosen, candidates, np.arange(most)[None, :] < counts[:, None], axis=1)
    return chosen


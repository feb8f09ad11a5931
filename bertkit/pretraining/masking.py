"""Masked-LM masking as in Google's create_pretraining_data.py, shared by static masking (once,
in preprocessing: static_masked_copies) and dynamic masking (in the collator, every time a
sequence is fed: DynamicMaskingCollator); the collators of both kinds build the batches.

Why not transformers' DataCollatorForLanguageModeling: it draws a Bernoulli per token, so the
masked count varies and can exceed max_predictions_per_seq, and it has neither static masks
nor span masking. Here each sequence gets a fixed count of predictions, chosen by whole unit
(token, word or span), then 80% [MASK] / 10% random token / 10% unchanged.

masking.convention says what the count is a share of, which tokens may be chosen and what a
random replacement is drawn from:
- google (the default), as create_masked_lm_predictions does: min(max_predictions_per_seq,
  max(1, round(len(tokens) * mlm_probability))) where tokens counts [CLS] and [SEP]; every
  token but [CLS], [SEP] (and bertkit's padding, [PAD]) may be chosen, [UNK] and [MASK]
  included; a random replacement is any id of the vocabulary, specials included.
- non_special (bertkit's rule before issue 51): min(max_predictions_per_seq,
  max(1, round(non-special tokens * mlm_probability))); no special token of the tokenizer
  (all_special_ids: [PAD], [UNK], [CLS], [SEP], [MASK]) is ever chosen or drawn as a
  replacement.
round is half-to-even (Python's round, np.round) in both: 4.5 -> 4, 7.5 -> 8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import datasets
import numpy as np
import torch
from transformers import DataCollatorForTokenClassification, PreTrainedTokenizerBase

from bertkit.errors import BertkitError
from bertkit.pretraining.batches import (
    IGNORE_INDEX,
    Columns,
    PackShape,
    PhaseShapes,
    model_batch,
    packed_batch,
    slots_of,
)

UNITS = ("token", "whole_word", "span")  # masking.unit's choices (config_schema)
CONVENTIONS = ("google", "non_special")  # masking.convention's choices (module docstring)


@dataclass(frozen=True)
class MaskingRule:
    mlm_probability: float
    mask_token_fraction: float
    random_token_fraction: float
    max_predictions_per_seq: int
    unit: str
    span_geometric_p: float
    span_max_words: int
    convention: str = "google"

    def __post_init__(self) -> None:
        """The rule between two settings; each one's type and range is the schema's
        (bertkit.config_schema.MaskingSchema: masking.* and heldout.masking.*)."""
        if self.convention not in CONVENTIONS:
            raise BertkitError(f"masking.convention={self.convention}: expected one of "
                               f"{', '.join(CONVENTIONS)}")
        if self.mask_token_fraction + self.random_token_fraction > 1:
            raise BertkitError(
                f"masking.mask_token_fraction={self.mask_token_fraction} and "
                f"masking.random_token_fraction={self.random_token_fraction}: expected two shares "
                f">= 0 whose sum is at most 1 (the rest stays unchanged)")


@dataclass(frozen=True)
class Vocabulary:
    """What masking needs to know of a WordPiece vocabulary, as arrays indexed by token id."""

    mask_id: int
    special: np.ndarray        # the tokenizer's special tokens (all_special_ids)
    continuation: np.ndarray   # "##" pieces: they belong to the word before them
    replacement_ids: np.ndarray  # the non-special ids (convention non_special's replacements)
    frame: np.ndarray          # [CLS], [SEP] and [PAD]: never chosen under any convention
    padding: np.ndarray        # [PAD]: not part of the sequence, never counted

    @classmethod
    def from_tokenizer(cls, tokenizer) -> Vocabulary:
        size = len(tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
        special = np.zeros(size, dtype=bool)
        special[tokenizer.all_special_ids] = True
        continuation = np.array([token.startswith("##") for token in tokens], dtype=bool)
        padding = np.zeros(size, dtype=bool)
        padding[tokenizer.pad_token_id] = True
        frame = padding.copy()
        frame[[tokenizer.cls_token_id, tokenizer.sep_token_id]] = True
        return cls(tokenizer.mask_token_id, special, continuation, np.flatnonzero(~special),
                   frame, padding)

    def excluded(self, convention: str) -> np.ndarray:
        """Per id: never chosen under the convention."""
        return self.frame if convention == "google" else self.special

    def replacements(self, convention: str) -> np.ndarray:
        """The ids a random replacement is drawn from (uniformly) under the convention."""
        return np.arange(self.special.size) if convention == "google" else self.replacement_ids


def candidates_and_budgets(ids: np.ndarray, vocab: Vocabulary, rules) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    """(candidates, budgets) of a sequence (ids 1-D, one rule) or of a padded batch (ids
    [rows, width], one rule per row): the positions the rule may choose, and how many it
    chooses: its count (prediction_budget of what the convention counts), never more than
    the candidates. Padding ([PAD]) is never a candidate and never counted."""
    rules = [rules] if isinstance(rules, MaskingRule) else list(rules)
    google = np.array([rule.convention == "google" for rule in rules])
    if ids.ndim == 2:
        google = google[:, None]
    candidates = ~np.where(google, vocab.frame[ids], vocab.special[ids])
    counted = np.where(google, ~vocab.padding[ids], candidates).sum(axis=-1)
    budgets = prediction_budget(counted, np.array([rule.mlm_probability for rule in rules]),
                                np.array([rule.max_predictions_per_seq for rule in rules]))
    budgets = np.minimum(budgets, candidates.sum(axis=-1))
    return candidates, budgets if ids.ndim == 2 else budgets[0]


def _units(ids: np.ndarray, candidates: np.ndarray, vocab: Vocabulary, whole_words: bool):
    """Maskable units: single positions, or whole words (a piece plus its ## continuations)."""
    if not whole_words:
        return [[int(p)] for p in candidates]
    units: list[list[int]] = []
    for position in candidates:
        if units and vocab.continuation[ids[position]] and units[-1][-1] == position - 1:
            units[-1].append(int(position))
        else:
            units.append([int(position)])
    return units


def choose_positions(ids: np.ndarray, vocab: Vocabulary, rule: MaskingRule,
                     rng: np.random.Generator) -> np.ndarray:
    """Sorted positions to predict: never [CLS], [SEP] or padding, nor under convention
    non_special any other special token."""
    candidate_mask, budget = candidates_and_budgets(ids, vocab, rule)
    candidates = np.flatnonzero(candidate_mask)
    if candidates.size == 0:
        return candidates
    budget = int(budget)
    units = _units(ids, candidates, vocab, whole_words=True) if rule.unit != "token" else []
    chosen: list[int] = []
    if rule.unit == "span":
        taken = np.zeros(len(units), dtype=bool)
        for _ in range(10 * len(units)):  # bounded: a span that does not fit is skipped
            if len(chosen) >= budget:
                break
            length = min(int(rng.geometric(rule.span_geometric_p)), rule.span_max_words)
            start = int(rng.integers(len(units)))
            words = range(start, min(start + length, len(units)))
            new = [w for w in words if not taken[w]]
            size = sum(len(units[w]) for w in new)
            if not new or len(new) < len(words) or len(chosen) + size > budget:
                continue
            for w in new:
                taken[w] = True
                chosen.extend(units[w])
    elif rule.unit == "token":
        # Google's shuffle-and-take with one-token units is a uniform draw without replacement.
        return np.sort(rng.choice(candidates, size=budget, replace=False))
    else:
        # As Google's code does: shuffle the units, take each that still fits the budget.
        for index in rng.permutation(len(units)):
            if len(chosen) >= budget:
                break
            if len(chosen) + len(units[index]) <= budget:
                chosen.extend(units[index])
    return np.sort(np.array(chosen, dtype=np.int64))


def mask_sequence(ids, vocab: Vocabulary, rule: MaskingRule,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(masked input ids, labels): labels hold the original id at predicted positions only."""
    ids = np.asarray(ids, dtype=np.int64)
    positions = choose_positions(ids, vocab, rule, rng)
    labels = np.full_like(ids, IGNORE_INDEX)
    labels[positions] = ids[positions]
    chosen = np.zeros(ids.shape, dtype=bool)
    chosen[positions] = True
    return replace_chosen(ids, chosen, vocab, rule.mask_token_fraction, rule.random_token_fraction,
                          rng, rule.convention), labels


def replace_chosen(ids: np.ndarray, chosen: np.ndarray, vocab: Vocabulary, mask_share,
                   random_share, rng: np.random.Generator,
                   convention: str = "google") -> np.ndarray:
    """A copy of ids with the chosen positions replaced 80/10/10: [MASK], a random token
    (vocab.replacements(convention)), or left unchanged. The shares may be arrays that
    broadcast against ids (one per row)."""
    draw = rng.random(ids.shape)
    to_mask = chosen & (draw < mask_share)
    to_random = chosen & (draw >= mask_share) & (draw < mask_share + random_share)
    masked = ids.copy()
    masked[to_mask] = vocab.mask_id
    masked[to_random] = rng.choice(vocab.replacements(convention), size=int(to_random.sum()))
    return masked


def prediction_budget(count, rule_probability, max_predictions):
    """min(max_predictions, max(1, round(count * p))), 0 when count is 0, where count is what
    the convention counts: under google the sequence's tokens with [CLS] and [SEP] (Google's
    num_to_predict), under non_special its non-special tokens. round is half-to-even, as
    Python's round is (Google's code under Python 3). Works on numbers or on arrays (one per
    sequence)."""
    count = np.asarray(count)
    budget = np.minimum(max_predictions, np.maximum(1, np.round(count * rule_probability)))
    return np.where(count > 0, budget, 0).astype(np.int64)


def most_predictions(length, rule: MaskingRule):
    """The most predictions the rule makes in a sequence of `length` tokens ([CLS] and [SEP]
    included, padding not): prediction_budget(length, ...). Under convention google that is
    the count itself (fewer only where the sequence has fewer candidates, or whole words or
    spans do not fill it); under non_special the count is of the length less its 2 or 3
    [CLS]/[SEP] (and any other special token), and prediction_budget never grows as its count
    shrinks, so the google count of the length is an upper bound. Numbers or arrays."""
    return prediction_budget(length, rule.mlm_probability, rule.max_predictions_per_seq)


def masking_rule_from_config(masking) -> MaskingRule:
    return MaskingRule(
        mlm_probability=masking.mlm_probability,
        mask_token_fraction=masking.mask_token_fraction,
        random_token_fraction=masking.random_token_fraction,
        max_predictions_per_seq=masking.max_predictions_per_seq,
        unit=masking.unit,
        span_geometric_p=masking.span_geometric_p,
        span_max_words=masking.span_max_words,
        convention=masking.convention,
    )


# Static masking (BERT's original): masks drawn once in preprocessing, `dupe_factor` copies of
# the data each with its own masks, stored and reused in every epoch.
#
# Each row's generator is seeded by (seed, copy, row index), so the masks do not depend on
# datasets.map's process count or batch size, and a rerun reproduces them exactly.


def static_masked_copies(dataset: datasets.Dataset, vocab: Vocabulary, rule: MaskingRule, *,
                         dupe_factor: int, seed: int, num_proc: int | None = None,
                         cache_dir: str | None = None) -> datasets.Dataset:
    """`dupe_factor` masked copies, concatenated: input_ids masked, labels added."""

    def mask_batch(batch: dict, indices: list[int], copy: int) -> dict:
        masked, labels = [], []
        for ids, index in zip(batch["input_ids"], indices, strict=True):
            rng = np.random.default_rng([seed, copy, index])
            row_ids, row_labels = mask_sequence(ids, vocab, rule, rng)
            masked.append(row_ids)
            labels.append(row_labels)
        return {"input_ids": masked, "labels": labels}

    copies = []
    for copy in range(dupe_factor):
        cache = None if cache_dir is None else f"{cache_dir}/static-mask-{seed}-{copy}.arrow"
        copies.append(dataset.map(mask_batch, batched=True, with_indices=True,
                                  fn_kwargs={"copy": copy}, num_proc=num_proc,
                                  cache_file_name=cache, desc=f"Static masking, copy {copy + 1}"))
    return datasets.concatenate_datasets(copies)


# Dynamic masking (RoBERTa): a fresh mask each time a sequence is fed to the model.


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
        phases' shapes of padding-free batches (bertkit.pretraining.batches), the
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

"""Masked-LM masking as in Google's create_pretraining_data.py, shared by static masking (once,
in preprocessing) and dynamic masking (in the collator, every time a sequence is fed).

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

from dataclasses import dataclass

import numpy as np

from bertkit.errors import BertkitError

UNITS = ("token", "whole_word", "span")  # masking.unit's choices (config_schema)
CONVENTIONS = ("google", "non_special")  # masking.convention's choices (module docstring)
IGNORE_INDEX = -100  # the label torch's cross-entropy skips


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

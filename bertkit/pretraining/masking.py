"""Masked-LM masking as in Google's create_pretraining_data.py, shared by static masking (once,
in preprocessing) and dynamic masking (in the collator, every time a sequence is fed).

Why not transformers' DataCollatorForLanguageModeling: it draws a Bernoulli per token, so the
masked count varies and can exceed max_predictions_per_seq, and it has neither static masks
nor span masking. Here each sequence gets exactly min(max_predictions_per_seq,
max(1, round(candidates * mlm_probability))) predictions, chosen by whole unit (token, word
or span), then 80% [MASK] / 10% random token / 10% unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertkit.errors import BertkitError

UNITS = ("token", "whole_word", "span")  # masking.unit's choices (config_schema)
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

    def __post_init__(self) -> None:
        """The rule between two settings; each one's type and range is the schema's
        (bertkit.config_schema.MaskingSchema: masking.* and heldout.masking.*)."""
        if self.mask_token_fraction + self.random_token_fraction > 1:
            raise BertkitError(
                f"masking.mask_token_fraction={self.mask_token_fraction} and "
                f"masking.random_token_fraction={self.random_token_fraction}: expected two shares "
                f">= 0 whose sum is at most 1 (the rest stays unchanged)")


@dataclass(frozen=True)
class Vocabulary:
    """What masking needs to know of a WordPiece vocabulary, as arrays indexed by token id."""

    mask_id: int
    special: np.ndarray        # never masked, never drawn as a random replacement
    continuation: np.ndarray   # "##" pieces: they belong to the word before them
    replacement_ids: np.ndarray  # the ids a random replacement is drawn from

    @classmethod
    def from_tokenizer(cls, tokenizer) -> Vocabulary:
        size = len(tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
        special = np.zeros(size, dtype=bool)
        special[tokenizer.all_special_ids] = True
        continuation = np.array([token.startswith("##") for token in tokens], dtype=bool)
        return cls(tokenizer.mask_token_id, special, continuation, np.flatnonzero(~special))


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
    """Sorted positions to predict; never special tokens or padding."""
    candidates = np.flatnonzero(~vocab.special[ids])
    if candidates.size == 0:
        return candidates
    budget = int(prediction_budget(candidates.size, rule.mlm_probability,
                                   rule.max_predictions_per_seq))
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
                          rng), labels


def replace_chosen(ids: np.ndarray, chosen: np.ndarray, vocab: Vocabulary, mask_share,
                   random_share, rng: np.random.Generator) -> np.ndarray:
    """A copy of ids with the chosen positions replaced 80/10/10: [MASK], a random token, or
    left unchanged. The shares may be arrays that broadcast against ids (one per row)."""
    draw = rng.random(ids.shape)
    to_mask = chosen & (draw < mask_share)
    to_random = chosen & (draw >= mask_share) & (draw < mask_share + random_share)
    masked = ids.copy()
    masked[to_mask] = vocab.mask_id
    masked[to_random] = rng.choice(vocab.replacement_ids, size=int(to_random.sum()))
    return masked


def prediction_budget(candidates, rule_probability, max_predictions):
    """Google's count: min(max_predictions, max(1, round(candidates * p))), 0 without any
    candidate. Works on numbers or on arrays (one per sequence)."""
    budget = np.minimum(max_predictions,
                        np.maximum(1, np.round(np.asarray(candidates) * rule_probability)))
    return np.where(np.asarray(candidates) > 0, budget, 0).astype(np.int64)


def masking_rule_from_config(masking) -> MaskingRule:
    return MaskingRule(
        mlm_probability=masking.mlm_probability,
        mask_token_fraction=masking.mask_token_fraction,
        random_token_fraction=masking.random_token_fraction,
        max_predictions_per_seq=masking.max_predictions_per_seq,
        unit=masking.unit,
        span_geometric_p=masking.span_geometric_p,
        span_max_words=masking.span_max_words,
    )

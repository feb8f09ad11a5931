"""Dynamic masking (RoBERTa): a fresh mask each time a sequence is fed to the model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DataCollatorForTokenClassification, PreTrainedTokenizerBase

from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    MaskingRule,
    Vocabulary,
    mask_sequence,
    prediction_budget,
    replace_chosen,
)


def padding_collator(tokenizer: PreTrainedTokenizerBase, pad_to_multiple_of: int | None):
    """Pads input_ids and the other inputs, and `labels` with -100.

    DataCollatorForTokenClassification is exactly that (its name aside): per-position labels
    padded with the index the loss ignores.
    """
    return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


class DynamicMaskingCollator:
    """Masks each example as its batch is built, then pads.

    The generator is seeded from torch's RNG at every batch: Trainer seeds that RNG (and gives
    each DataLoader worker its own), so runs are reproducible and workers never repeat masks.
    Token masking runs on the padded batch as a whole (a random rank per position, the
    lowest `budget` of each row chosen): the same distribution as mask_sequence, without its
    per-sequence Python. Whole-word and span masking go sequence by sequence.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 rules: MaskingRule | Sequence[tuple[int, MaskingRule]],
                 pad_to_multiple_of: int | None = None):
        """rules: one rule, or (longest sequence, rule) pairs by increasing length, e.g. the
        paper's phases: 20 predictions up to 128 tokens, 80 up to 512."""
        self.vocab = Vocabulary.from_tokenizer(tokenizer)
        self.rules = [(None, rules)] if isinstance(rules, MaskingRule) else list(rules)
        self.pad = padding_collator(tokenizer, pad_to_multiple_of)

    def rule_for(self, length: int) -> MaskingRule:
        for longest, rule in self.rules:
            if longest is None or length <= longest:
                return rule
        return self.rules[-1][1]

    def __call__(self, features: list[dict]) -> dict:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        rules = [self.rule_for(len(feature["input_ids"])) for feature in features]
        if all(rule.unit == "token" for rule in rules):
            return self._mask_padded_batch(self.pad(features), rules, rng)
        masked = []
        for feature, rule in zip(features, rules, strict=True):
            ids, labels = mask_sequence(feature["input_ids"], self.vocab, rule, rng)
            masked.append({**feature, "input_ids": ids.tolist(), "labels": labels.tolist()})
        return self.pad(masked)

    def _mask_padded_batch(self, batch: dict, rules: list[MaskingRule],
                           rng: np.random.Generator) -> dict:
        ids = batch["input_ids"].numpy()
        special = self.vocab.special[ids]  # [CLS], [SEP] and the padding
        budget = prediction_budget((~special).sum(axis=1),
                                   np.array([rule.mlm_probability for rule in rules]),
                                   np.array([rule.max_predictions_per_seq for rule in rules]))
        keys = rng.random(ids.shape)
        keys[special] = 2.0  # after every candidate
        rank = keys.argsort(axis=1).argsort(axis=1)
        chosen = rank < budget[:, None]
        column = np.array([[rule.mask_token_fraction, rule.random_token_fraction]
                           for rule in rules])
        masked = replace_chosen(ids, chosen, self.vocab, column[:, :1], column[:, 1:], rng)
        batch["input_ids"] = torch.from_numpy(masked)
        batch["labels"] = torch.from_numpy(np.where(chosen, ids, IGNORE_INDEX))
        return batch

"""Dynamic masking (RoBERTa): a fresh mask each time a sequence is fed to the model."""

from __future__ import annotations

import numpy as np
import torch
from transformers import DataCollatorForTokenClassification, PreTrainedTokenizerBase

from bertkit.mlm_masking import MaskingRule, Vocabulary, mask_sequence


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
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, rule: MaskingRule,
                 pad_to_multiple_of: int | None = None):
        self.vocab = Vocabulary.from_tokenizer(tokenizer)
        self.rule = rule
        self.pad = padding_collator(tokenizer, pad_to_multiple_of)

    def __call__(self, features: list[dict]) -> dict:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        masked = []
        for feature in features:
            ids, labels = mask_sequence(feature["input_ids"], self.vocab, self.rule, rng)
            masked.append({**feature, "input_ids": ids.tolist(), "labels": labels.tolist()})
        return self.pad(masked)

"""Masked LM alone (RoBERTa, Liu et al. 2019): sequences packed with whole consecutive
sentences, across documents (FULL-SENTENCES; conf/objective/mlm.yaml). No sentence task: the
sentence head gets no label and no loss."""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.pretraining.instances import packed_columns, packed_sequences_dataset
from bertkit.pretraining.objective import Objective, register


@register
class MaskedLM(Objective):
    title = "masked LM alone"
    summary = "full sentences packed across documents"
    packing = "full_sentences"

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        """Cut one way (no randomness): copies differ by their masks only."""
        return packed_sequences_dataset(tokenized, tokenizer, max_seq_length=max_seq_length,
                                        num_proc=num_proc)

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        return packed_columns(documents, max_seq_length=max_seq_length, cls_id=cls_id,
                              sep_id=sep_id)

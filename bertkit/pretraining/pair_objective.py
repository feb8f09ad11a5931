"""What the sentence-pair objectives (NSP, SOP) share: Google's packing of a document into
`[CLS] A [SEP] B [SEP]` pairs (bertkit.pretraining.sentence_pairs), labelled by the objective's
sentence task in the next_sentence_label column."""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets
from transformers import PreTrainedTokenizerBase

from bertkit.pretraining.instances import PAIR_COLUMNS, add_pair_rows, pair_instances_dataset
from bertkit.pretraining.objective import Objective


class SentencePairObjective(Objective):
    packing = "pairs"
    second_segment = True  # segment A, then B (token type 1)
    cuts_each_copy = True  # each duplicate cuts the documents anew, as Google's dupe_factor

    def instances(self, tokenized: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, short_seq_prob: float, seed: int, copies: int = 1,
                  num_proc: int | None = None) -> datasets.Dataset:
        return pair_instances_dataset(
            tokenized, tokenizer, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
            seed=seed, copies=copies, num_proc=num_proc, sentence_task=self.sentence_task)

    def buffer_rows(self, documents: Sequence, rng: random.Random, *, max_seq_length: int,
                    short_seq_prob: float, cls_id: int, sep_id: int) -> dict:
        """A buffer of fewer documents than needed (the last of a stream, say) gives none."""
        out = {key: [] for key in PAIR_COLUMNS}
        if len(documents) < self.documents_needed:
            return out
        for index in range(len(documents)):
            add_pair_rows(out, documents, index, rng, sentence_task=self.sentence_task,
                          max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                          cls_id=cls_id, sep_id=sep_id)
        return out

"""Static masking (BERT's original): masks drawn once in preprocessing, `dupe_factor` copies of
the data each with its own masks, stored and reused in every epoch.

Each row's generator is seeded by (seed, copy, row index), so the masks do not depend on
datasets.map's process count or batch size, and a rerun reproduces them exactly.
"""

from __future__ import annotations

import datasets
import numpy as np

from bertkit.pretraining.masking import MaskingRule, Vocabulary, mask_sequence


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

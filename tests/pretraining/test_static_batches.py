"""Pretraining batches of static shape: the phase's length and its number of masked slots,
the same batch from Arrow rows as from feature dicts, and the same masks as ranking each row's
keys (the collator's partial sort)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

from bertkit.pretraining.batches import ArrowRows, per_position_labels
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    DynamicMaskingCollator,
    MaskingRule,
    StaticMasksCollator,
    Vocabulary,
    _lowest,
    static_masked_copies,
)
from tests.pretraining.test_mlm_masking import sequences, tokenizer  # noqa: F401 (fixture)


def rule(predictions: int) -> MaskingRule:
    return MaskingRule(mlm_probability=0.15, mask_token_fraction=0.8, random_token_fraction=0.1,
                       max_predictions_per_seq=predictions, unit="token", span_geometric_p=0.2,
                       span_max_words=10)


def rows_of(tokenizer, n, seed, longest):  # noqa: F811
    rows = [r[r != tokenizer.pad_token_id] for r in sequences(tokenizer, n, seed=seed)]
    return [r[:longest].tolist() for r in rows]


def test_every_batch_of_a_phase_has_its_length_and_slots(tokenizer):  # noqa: F811
    collate = DynamicMaskingCollator(tokenizer, [(24, rule(4)), (64, rule(9))])
    short = rows_of(tokenizer, 8, 1, longest=20)
    long = rows_of(tokenizer, 8, 2, longest=60)
    for features, width, slots in ((short, 24, 4), (long, 64, 9)):
        batch = collate([{"input_ids": ids} for ids in features])
        assert batch["input_ids"].shape == (8, width)
        assert batch["mlm_positions"].shape == batch["mlm_labels"].shape == (8, slots)
        labels = per_position_labels(batch)
        used = (batch["mlm_labels"] != IGNORE_INDEX).sum(1)
        assert torch.equal(used, (labels != IGNORE_INDEX).sum(1))
        assert (used >= 1).all()
        # Unused slots point at position 0 and weigh nothing.
        assert (batch["mlm_positions"][batch["mlm_labels"] == IGNORE_INDEX] == 0).all()
    # A batch without padding: a mask of ones (the trainer drops it where that pays).
    full = collate([{"input_ids": ids[:10] + [tokenizer.sep_token_id] * 14} for ids in short])
    assert full["attention_mask"].all()


def test_arrow_rows_and_feature_dicts_give_the_same_batch(tokenizer):  # noqa: F811
    features = [{"input_ids": ids, "token_type_ids": [0] * len(ids),
                 "next_sentence_label": i % 2}
                for i, ids in enumerate(rows_of(tokenizer, 12, 3, longest=50))]
    table = ArrowRows(datasets.Dataset.from_list(features))
    collate = DynamicMaskingCollator(tokenizer, [(64, rule(9))])
    torch.manual_seed(0)
    from_dicts = collate(features)
    torch.manual_seed(0)
    from_arrow = collate(table.__getitems__(list(range(12))))
    assert from_dicts.keys() == from_arrow.keys()
    for key in from_dicts:
        assert torch.equal(from_dicts[key], from_arrow[key]), key


def test_static_masks_are_read_into_slots_as_stored(tokenizer):  # noqa: F811
    vocab = Vocabulary.from_tokenizer(tokenizer)
    dataset = datasets.Dataset.from_dict({"input_ids": rows_of(tokenizer, 16, 4, longest=60)})
    static = static_masked_copies(dataset, vocab, rule(9), dupe_factor=1, seed=3)
    batch = StaticMasksCollator(tokenizer, [(64, 9)])(ArrowRows(static).__getitems__(
        list(range(16))))
    labels = per_position_labels(batch)
    for row, stored in enumerate(static["labels"]):
        assert labels[row, :len(stored)].tolist() == stored
        assert (labels[row, len(stored):] == IGNORE_INDEX).all()


@pytest.mark.parametrize("width", [7, 40])
def test_the_partial_sort_chooses_each_rows_lowest_keys(width):
    rng = np.random.default_rng(width)
    keys = rng.random((50, width))
    counts = rng.integers(0, min(width, 9) + 1, size=50)
    rank = keys.argsort(axis=1).argsort(axis=1)  # the whole-row ranking it replaces
    assert np.array_equal(_lowest(keys, counts), rank < counts[:, None])


def test_without_static_shapes_a_batch_is_padded_to_its_longest_row(tokenizer):  # noqa: F811
    """A CPU without compile: per-batch widths (padding is compute there), slots of the phase."""
    collate = DynamicMaskingCollator(tokenizer, [(24, rule(4)), (64, rule(9))],
                                     pad_to_multiple_of=8, static=False)
    short = rows_of(tokenizer, 8, 1, longest=20)
    long = rows_of(tokenizer, 8, 2, longest=60)
    for features, slots in ((short, 4), (long, 9)):
        batch = collate([{"input_ids": ids} for ids in features])
        longest = max(len(ids) for ids in features)
        assert batch["input_ids"].shape[1] == min(-(-longest // 8) * 8, 64)
        assert batch["mlm_positions"].shape == (8, slots)

"""The attention masks bertkit hands the model: the same outputs as transformers' own mask
path, for SDPA and eager attention, and no mask at all for a batch without padding."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel, DataCollatorWithPadding

from bertkit.training.trainer import attach_padding_masks, without_full_masks


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_the_4d_mask_gives_transformers_outputs(implementation):
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        attn_implementation=implementation)
    torch.manual_seed(0)
    plain = BertModel(config).eval()
    ours = BertModel(config).eval()
    ours.load_state_dict(plain.state_dict())
    attach_padding_masks(ours)
    ids = torch.randint(5, 60, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    expected = plain(ids, attention_mask=mask).last_hidden_state
    got = ours(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real])
    # Positional masks too (BertModel(input_ids, attention_mask)).
    torch.testing.assert_close(ours(ids, mask).last_hidden_state[real], expected[real])


def test_a_batch_without_padding_goes_without_a_mask(vocab_dir):
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(vocab_dir))
    collate = without_full_masks(DataCollatorWithPadding(tokenizer))
    assert without_full_masks(collate) is collate
    even = [{"input_ids": [2, 9, 10, 3]}, {"input_ids": [2, 11, 12, 3]}]
    ragged = [{"input_ids": [2, 9, 10, 3]}, {"input_ids": [2, 11, 3]}]
    assert "attention_mask" not in collate(even)
    assert collate(ragged)["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]

"""Finetuning batch widths: buckets of bucket_width where static shapes pay (a GPU, or
torch_compile), each batch's longest on a CPU without compile, and DataCollatorWithPadding
holding widths to the multiples."""

from __future__ import annotations

import pytest
from transformers import BertTokenizerFast, DataCollatorWithPadding

from bertkit.training.trainer import padding_multiple
from tests.conftest import compose_config


@pytest.mark.parametrize("overrides, mixed, expected", [
    ([], False, None),                                        # CPU, eager: per-batch padding
    (["trainer.torch_compile=true"], False, 32),
    (["trainer.torch_compile_mode=reduce-overhead"], False, 32),
    (["buckets_on_cpu=true"], False, 32),
    (["buckets_on_cpu=true", "bucket_width=1"], False, None),
    (["buckets_on_cpu=true", "bucket_width=12"], True, 24),   # and 8 under mixed precision
    ([], True, 8),
])
def test_the_padding_multiple_of_a_run(overrides, mixed, expected):
    assert padding_multiple(compose_config(["recipe=glue", *overrides]), mixed) == expected


def test_bucketed_batches_take_only_multiples_of_the_bucket(vocab_dir):
    tokenizer = BertTokenizerFast.from_pretrained(str(vocab_dir))
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=32)
    for length in (3, 31, 32, 33, 70):
        batch = collate([{"input_ids": [2] + [9] * (length - 2) + [3]},
                         {"input_ids": [2, 9, 3]}])
        assert batch["input_ids"].shape[1] == -(-length // 32) * 32

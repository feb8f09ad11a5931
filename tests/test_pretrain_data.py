"""The pretraining data pipeline on datasets: documents to NSP instances, deterministic
whatever the process count, with the layout BertForPreTraining expects."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertkit.pretrain_data import documents_dataset, pair_instances_dataset, tokenize_documents

WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vocab")
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
    return BertTokenizerFast.from_pretrained(str(directory))


def generated_documents(n: int = 40, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(WORDS, size=rng.integers(4, 15))) + " ."
             for _ in range(rng.integers(2, 12))] for _ in range(n)]


def test_instances_have_the_pretraining_layout(tokenizer):
    documents = generated_documents()
    tokenized = tokenize_documents(documents_dataset(documents), tokenizer)
    assert len(tokenized) == 40
    first = tokenized[0]["sentence_ids"]
    assert first[0] == tokenizer(documents[0][0], add_special_tokens=False)["input_ids"]

    instances = pair_instances_dataset(tokenized, tokenizer, max_seq_length=48,
                                       short_seq_prob=0.1, seed=3, copies=2)
    assert set(instances.column_names) == {"input_ids", "token_type_ids",
                                           "next_sentence_label", "length"}
    for row in instances:
        ids, types = row["input_ids"], row["token_type_ids"]
        assert len(ids) == len(types) == row["length"] <= 48
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert ids.count(tokenizer.sep_token_id) == 2
        boundary = ids.index(tokenizer.sep_token_id)
        assert types == [0] * (boundary + 1) + [1] * (len(ids) - boundary - 1)
    labels = np.array(instances["next_sentence_label"])
    assert set(labels) <= {0, 1} and 0.3 < labels.mean() < 0.7
    half = len(instances) // 2
    # The two copies cut the documents differently.
    assert instances[:half]["input_ids"] != instances[half:]["input_ids"]


def test_instances_do_not_depend_on_the_process_count(tokenizer):
    tokenized = tokenize_documents(documents_dataset(generated_documents(seed=1)), tokenizer)
    one = pair_instances_dataset(tokenized, tokenizer, max_seq_length=32, short_seq_prob=0.1,
                                 seed=5)
    two = pair_instances_dataset(tokenized, tokenizer, max_seq_length=32, short_seq_prob=0.1,
                                 seed=5, num_proc=2)
    assert one["input_ids"] == two["input_ids"]
    assert one["next_sentence_label"] == two["next_sentence_label"]

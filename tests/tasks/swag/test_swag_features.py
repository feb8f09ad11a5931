"""SWAG choices (bertkit.tasks.swag.features) token by token on a hand-made example with a
whole-word vocabulary: the four `[CLS] sent1 [SEP] sent2 ending [SEP]` encodings and their
segment ids, truncation of the second segment only, `length`, the collator padding the four
choices together, and the on-disk cache."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import BertTokenizerFast, DataCollatorForMultipleChoice

from bertkit.data.cache import cache_entry
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.swag import features as swag_features
from bertkit.tasks.swag.features import encode_batch, encode_splits
from bertkit.tasks.swag.files import FEATURES

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "man", "opens", "door",
         "he", "walks", "in", "sits", "down", "eats", "smiles", "at", "a", "dog", "slowly"]
ID = {token: i for i, token in enumerate(VOCAB)}

EXAMPLE = {"idx": 0, "video_id": "v", "fold_ind": "7", "sent1": "The man opens the door.",
           "sent2": "He", "ending0": "walks in.", "ending1": "sits down.",
           "ending2": "eats the door.", "ending3": "smiles at a dog slowly.", "label": 1}
CONTEXT = ["[CLS]", "the", "man", "opens", "the", "door", ".", "[SEP]"]
SECOND = [["he", "walks", "in", "."], ["he", "sits", "down", "."],
          ["he", "eats", "the", "door", "."], ["he", "smiles", "at", "a", "dog", "slowly", "."]]


@pytest.fixture
def tokenizer(tmp_path) -> BertTokenizerFast:
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return BertTokenizerFast.from_pretrained(str(tmp_path))


def batch_of(*examples: dict) -> dict:
    return {key: [example[key] for example in examples] for key in EXAMPLE}


def test_four_choices_token_by_token(tokenizer):
    out = encode_batch(batch_of(EXAMPLE), tokenizer, max_seq_length=128)
    assert len(out["input_ids"]) == 1 and len(out["input_ids"][0]) == 4
    for k in range(4):
        tokens = CONTEXT + SECOND[k] + ["[SEP]"]
        assert out["input_ids"][0][k] == [ID[t] for t in tokens], k
        assert out["token_type_ids"][0][k] == [0] * len(CONTEXT) + [1] * (len(SECOND[k]) + 1)
        assert out["attention_mask"][0][k] == [1] * len(tokens)
    assert out["length"] == [len(CONTEXT) + len(SECOND[3]) + 1]  # the longest choice: 16


def test_empty_sent2_leaves_the_ending_alone(tokenizer):
    out = encode_batch(batch_of({**EXAMPLE, "sent2": ""}), tokenizer, max_seq_length=128)
    assert out["input_ids"][0][0] == [ID[t] for t in CONTEXT + ["walks", "in", ".", "[SEP]"]]


def test_only_the_second_segment_is_truncated(tokenizer):
    """11 tokens: the 8 of [CLS] context [SEP] stay, the second segment keeps its first 2."""
    out = encode_batch(batch_of(EXAMPLE), tokenizer, max_seq_length=11)
    assert [tokenizer.convert_ids_to_tokens(ids) for ids in out["input_ids"][0]] == [
        CONTEXT + ["he", "walks", "[SEP]"], CONTEXT + ["he", "sits", "[SEP]"],
        CONTEXT + ["he", "eats", "[SEP]"], CONTEXT + ["he", "smiles", "[SEP]"]]
    assert out["token_type_ids"][0] == [[0] * 8 + [1] * 3] * 4
    assert out["length"] == [11]


def test_a_context_that_fills_the_length_is_an_error_naming_the_example(tokenizer):
    """10 tokens: 6 of context + 3 special tokens leave one for the ending; 7 leave none."""
    long_context = {**EXAMPLE, "idx": 5, "sent1": "the man opens the door slowly."}
    with pytest.raises(BertkitError, match=r"task.max_seq_length=10: example 5 of the validation "
                                           r"split has 7 tokens in sent1 alone"):
        encode_batch(batch_of(EXAMPLE, long_context), tokenizer, max_seq_length=10,
                     split="validation")
    out = encode_batch(batch_of(EXAMPLE), tokenizer, max_seq_length=10)
    assert out["input_ids"][0][3] == [ID[t] for t in CONTEXT + ["he", "[SEP]"]]


def test_collator_pads_the_four_choices_of_a_batch_together(tokenizer):
    short = {**EXAMPLE, "sent1": "he walks.", "ending0": "in.", "ending1": "down.",
             "ending2": "at.", "ending3": "slowly.", "label": 3}
    out = encode_batch(batch_of(EXAMPLE, short), tokenizer, max_seq_length=128)
    assert out["length"] == [16, 9]
    features = [{"input_ids": out["input_ids"][i], "token_type_ids": out["token_type_ids"][i],
                 "attention_mask": out["attention_mask"][i], "label": label}
                for i, label in enumerate([1, 3])]
    batch = DataCollatorForMultipleChoice(tokenizer)(features)
    assert batch["input_ids"].shape == (2, 4, 16)
    assert batch["labels"].tolist() == [1, 3]
    # The short example: its own tokens, then [PAD] (id 0) with mask 0 and segment 0.
    for k in range(4):
        real = len(out["input_ids"][1][k])
        assert batch["input_ids"][1, k].tolist() == out["input_ids"][1][k] + [0] * (16 - real)
        assert batch["attention_mask"][1, k].tolist() == [1] * real + [0] * (16 - real)
        assert batch["token_type_ids"][1, k].tolist() == \
            out["token_type_ids"][1][k] + [0] * (16 - real)
    padded = DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=8)(features[1:])
    assert padded["input_ids"].shape == (1, 4, 16)  # 9 tokens, padded to a multiple of 8
    assert DataCollatorForMultipleChoice(tokenizer)(features[1:])["input_ids"].shape == (1, 4, 9)
    assert batch["input_ids"].dtype == torch.int64


def test_encoded_splits_are_cached_by_data_tokenizer_and_length(tokenizer, tmp_path,
                                                              monkeypatch):
    splits = TaskSplits({
        "train": datasets.Dataset.from_dict(batch_of(EXAMPLE, {**EXAMPLE, "idx": 1, "label": 3}),
                                            features=FEATURES),
        "validation": datasets.Dataset.from_dict(batch_of(EXAMPLE), features=FEATURES)},
        {"train": "data0", "validation": "data0"})
    cache = tmp_path / "cache"
    first = encode_splits(splits, tokenizer, max_seq_length=128, cache_dir=cache)
    assert sorted(first["train"].column_names) == sorted(
        ["idx", "label", "input_ids", "token_type_ids", "attention_mask", "length"])
    assert first["train"]["label"] == [1, 3] and first["train"]["idx"] == [0, 1]
    assert first["validation"]["input_ids"][0][2] == [ID[t] for t in
                                                      CONTEXT + SECOND[2] + ["[SEP]"]]
    (directory,) = (cache / "swag").iterdir()
    assert directory.name == cache_entry(cache, "swag", data=splits.fingerprint(),
                                         tokenizer=tokenizer,
                                         settings={"max_seq_length": 128}).name
    assert {p.name for p in directory.iterdir()} >= {"train.arrow", "validation.arrow"}
    assert first["train"].cache_files[0]["filename"] == str(directory / "train.arrow")

    # The same key reads the cache (the same tokenizer object, after it has truncated):
    # encoding again would fail here.
    def refuse(*args, **kwargs):
        raise AssertionError("re-encoded instead of reading the cache")

    with monkeypatch.context() as patch:
        patch.setattr(swag_features, "encode_batch", refuse)
        again = encode_splits(splits, tokenizer, max_seq_length=128, cache_dir=cache)
    assert again["train"].to_list() == first["train"].to_list()
    shorter = encode_splits(splits, tokenizer, max_seq_length=11, cache_dir=cache)
    assert len(list((cache / "swag").iterdir())) == 2
    assert shorter["validation"]["length"] == [11]
    with pytest.raises(BertkitError, match=r"task.max_seq_length=2: expected an integer"):
        encode_splits(splits, tokenizer, max_seq_length=2, cache_dir=cache)

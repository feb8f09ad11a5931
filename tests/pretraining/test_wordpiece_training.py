"""WordPiece vocabulary training: ids, pair template, casing, subword splits, caching."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from omegaconf import OmegaConf

from bertkit.config_schema import ModelSchema
from bertkit.errors import BertkitError
from bertkit.pretraining.wordpiece import (
    SPECIAL_TOKENS,
    ensure_trained_tokenizer,
    train_wordpiece,
    trained_tokenizer_dir,
)
from bertkit.training.models import load_tokenizer

SYLLABLES = ["ka", "lo", "mi", "ren", "tos", "vu", "zan", "pe", "dri", "gul", "sho", "nex"]
# Made-up words of two and three syllables: more distinct material than a 300-token vocab holds.
MADE_UP_WORDS = [a + b for a in SYLLABLES for b in SYLLABLES] + [
    a + b + c for a in SYLLABLES[:6] for b in SYLLABLES[3:9] for c in SYLLABLES[6:]]
# In every sentence, so each must become one token.
FREQUENT_WORDS = ["the", "and", "was"]
# Seen once: too rare (min_frequency=2) to become a token, so it must split into pieces.
RARE_WORD = "drigulshonexkarenvu"
SETTINGS = {"vocab_size": 300, "min_frequency": 2, "lowercase": True}


def sentences(count: int = 400, seed: int = 0) -> Iterator[str]:
    """A generator on purpose: training must stream, not need a list."""
    rng = random.Random(seed)
    for index in range(count):
        words = rng.choices(MADE_UP_WORDS, k=rng.randint(6, 12))
        for word in FREQUENT_WORDS:
            words.insert(rng.randrange(len(words) + 1), word)
        if index == count // 2:
            words.append(RARE_WORD)
        yield " ".join(words) + "."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wordpiece") / "vocab"
    return train_wordpiece(sentences(), directory, **SETTINGS), directory


def test_vocab_size_special_ids_and_saved_files(trained):
    tokenizer, directory = trained
    assert len(tokenizer) == SETTINGS["vocab_size"]
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id,
            tokenizer.sep_token_id, tokenizer.mask_token_id) == (0, 1, 2, 3, 4)
    assert tokenizer.model_max_length == 512
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= {
        p.name for p in directory.iterdir()}
    vocab_lines = (directory / "vocab.txt").read_text().splitlines()
    assert vocab_lines[:5] == SPECIAL_TOKENS
    assert len(vocab_lines) == SETTINGS["vocab_size"]
    assert {token: i for i, token in enumerate(vocab_lines)} == tokenizer.get_vocab()
    # Nothing half-written is left beside the published directory.
    assert [p.name for p in directory.parent.iterdir()] == ["vocab"]


def test_small_corpus_gives_at_most_the_requested_size(tmp_path):
    tokenizer = train_wordpiece(iter(["kalo mipe kalo mipe."] * 3), tmp_path / "v",
                                vocab_size=1000, min_frequency=1, lowercase=True)
    assert len(SPECIAL_TOKENS) < len(tokenizer) < 1000
    assert tokenizer.tokenize("kalo mipe") == ["kalo", "mipe"]


def test_saved_dir_reloads_through_load_tokenizer_with_identical_ids(trained):
    tokenizer, directory = trained
    # The model node as a job holds it: its schema's defaults under these values.
    model = OmegaConf.merge(OmegaConf.structured(ModelSchema),
                            {"name_or_path": None, "tokenizer": str(directory),
                             "do_lower_case": True, "config": {"max_position_embeddings": 512}})
    reloaded = load_tokenizer(model)
    text = f"Kalo MIPE renzan {RARE_WORD}, unseen-qq!"
    pair = ("lolo vuka", "peren tosgul")
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded(*pair)["input_ids"] == tokenizer(*pair)["input_ids"]
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.model_max_length == 512


def test_pair_encoding_is_cls_a_sep_b_sep(trained):
    tokenizer, _ = trained
    encoded = tokenizer("the and", "was")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["[CLS]", "the", "and", "[SEP]", "was", "[SEP]"]
    assert encoded["token_type_ids"] == [0, 0, 0, 0, 1, 1]
    single = tokenizer("kalo")["input_ids"]
    assert single[0] == tokenizer.cls_token_id and single[-1] == tokenizer.sep_token_id


def test_lowercase_folds_case_and_accents(trained, tmp_path):
    tokenizer, _ = trained
    assert tokenizer("THE KALO MiPe")["input_ids"] == tokenizer("the kalo mipe")["input_ids"]
    assert tokenizer("kálo thé")["input_ids"] == tokenizer("kalo the")["input_ids"]
    assert tokenizer.unk_token_id not in tokenizer("THE KALO")["input_ids"]
    cased = train_wordpiece(sentences(100), tmp_path / "cased", vocab_size=200,
                            min_frequency=2, lowercase=False)
    assert cased("THE")["input_ids"] != cased("the")["input_ids"]
    assert cased.tokenize("the") == ["the"]


def test_frequent_word_is_one_token_and_rare_long_word_splits(trained):
    tokenizer, _ = trained
    assert [tokenizer.tokenize(word) for word in FREQUENT_WORDS] == [[w] for w in FREQUENT_WORDS]
    assert RARE_WORD not in tokenizer.get_vocab()
    pieces = tokenizer.tokenize(RARE_WORD)
    assert len(pieces) >= 2
    assert not pieces[0].startswith("##")
    assert all(piece.startswith("##") for piece in pieces[1:])
    assert "".join(piece.removeprefix("##") for piece in pieces) == RARE_WORD
    ids = tokenizer(RARE_WORD)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == RARE_WORD


def test_ensure_trained_tokenizer_trains_once(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        return sentences(100)

    directory = trained_tokenizer_dir(tmp_path, "corpus-abc", vocab_size=200, min_frequency=2,
                                      lowercase=True)
    first = ensure_trained_tokenizer(texts, directory, vocab_size=200, min_frequency=2,
                                     lowercase=True)
    second = ensure_trained_tokenizer(texts, directory, vocab_size=200, min_frequency=2,
                                      lowercase=True)
    assert len(calls) == 1
    assert second.get_vocab() == first.get_vocab()
    assert second("kalo mipe", "lolo")["input_ids"] == first("kalo mipe", "lolo")["input_ids"]


def test_cache_dir_is_keyed_by_corpus_and_settings(tmp_path):
    base = {"vocab_size": 200, "min_frequency": 2, "lowercase": True}
    path = trained_tokenizer_dir(tmp_path, "corpus-abc", **base)
    assert path == trained_tokenizer_dir(str(tmp_path), "corpus-abc", **base)
    assert path.is_relative_to(tmp_path)
    others = [trained_tokenizer_dir(tmp_path, "corpus-xyz", **base)] + [
        trained_tokenizer_dir(tmp_path, "corpus-abc", **{**base, key: value})
        for key, value in [("vocab_size", 300), ("min_frequency", 3), ("lowercase", False)]]
    assert len({path, *others}) == 5


def test_retraining_replaces_the_directory_and_a_crash_leaves_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "vocab"
    train_wordpiece(sentences(100), directory, vocab_size=200, min_frequency=2, lowercase=True)
    smaller = train_wordpiece(sentences(100), directory, vocab_size=150, min_frequency=2,
                              lowercase=True)
    assert len(smaller) == 150
    assert len((directory / "vocab.txt").read_text().splitlines()) == 150
    assert [p.name for p in tmp_path.iterdir()] == ["vocab"]

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("transformers.BertTokenizerFast.save_pretrained", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        train_wordpiece(sentences(100), tmp_path / "other", vocab_size=200, min_frequency=2,
                        lowercase=True)
    assert [p.name for p in tmp_path.iterdir()] == ["vocab"]


def test_vocab_size_must_exceed_special_tokens(tmp_path):
    with pytest.raises(BertkitError, match="tokenizer_training.vocab_size"):
        train_wordpiece(sentences(10), tmp_path / "v", vocab_size=5, min_frequency=2,
                        lowercase=True)
    assert not (tmp_path / "v").exists()

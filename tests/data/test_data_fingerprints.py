"""Cache keys: a tokenizer keeps its fingerprint after encoding calls leave their truncation
settings behind in it, and two vocabularies never share one; content fingerprints change
with any part and with the parts' boundaries."""

from __future__ import annotations

from transformers import BertTokenizerFast

from bertkit.data.cache import content_fingerprint, tokenizer_fingerprint


def make_tokenizer(directory, words):
    directory.mkdir()
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return BertTokenizerFast.from_pretrained(str(directory))


def test_tokenizer_fingerprint_survives_encoding_calls_and_tells_vocabularies_apart(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "a", ["cat", "sat"])
    before = tokenizer_fingerprint(tokenizer)
    tokenizer(["cat sat"], ["sat cat sat cat"], truncation="only_second", max_length=8, stride=1,
              return_overflowing_tokens=True)
    assert tokenizer.backend_tokenizer.truncation is not None  # the call left its settings
    assert tokenizer_fingerprint(tokenizer) == before
    other = make_tokenizer(tmp_path / "b", ["cat", "mat"])
    assert tokenizer_fingerprint(other) != before


def test_content_fingerprint_depends_on_every_part_and_their_boundaries():
    base = content_fingerprint("v1.1", b"abc")
    assert base == content_fingerprint("v1.1", b"abc")
    assert base != content_fingerprint("v2.0", b"abc")
    assert base != content_fingerprint("v1.1", b"abd")
    assert content_fingerprint("ab", "c") != content_fingerprint("a", "bc")

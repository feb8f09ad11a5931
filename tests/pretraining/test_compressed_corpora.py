"""Compressed corpora: gzip, bzip2, xz (and zstd where a reader is installed) give exactly the
plain file's documents and pretraining instances, and key the cache by their content; any other
binary file is refused in one line naming it; an empty file is named in a warning."""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import os
import random
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.text_files import _zstd_open
from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import corpus_documents, ensure_demo_corpus, files_fingerprint
from bertkit.pretraining.run import prepare_pretraining_data, pretrain
from bertkit.training.run import build_training_arguments
from tests.conftest import compose_config
from tests.pretraining.test_corpus_source import corpus_config, documents
from tests.pretraining.test_pretrain_recipe import small_run

ZSTD_READER = _zstd_open() is not None


def _zstd(data: bytes) -> bytes:
    if shutil.which("zstd") is None:
        pytest.skip("no zstd command to write a .zst file")
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True,
                          check=True).stdout


COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
               ".zst": _zstd}
READABLE = [pytest.param(suffix, marks=pytest.mark.skipif(
    suffix == ".zst" and not ZSTD_READER, reason="no zstd reader (Python 3.14 or zstandard)"))
    for suffix in COMPRESSORS]
# A Latin-1 byte, CRLF endings, a WikiText title and escape: the decoding and line rules
# must be the plain file's after decompression too.
TEXTS = {
    "google": b"First doc, one.\r\nFirst doc, two.\r\n\r\nSecond doc, C\xe6sar.\n",
    "wikitext": " = Title = \n \n Line one . Line two .\n = = Part = = \n Three @-@ four .\n"
                " = Other = \n Caf\u00e9 .\n".encode(),
    "text": b"A book line\r\nwrapped here. Another sentence.\r\n\r\nLast paragraph.\r\n",
}


def compress(path: Path, data: bytes, suffix: str) -> Path:
    target = path.with_name(path.name + suffix)
    target.write_bytes(COMPRESSORS[suffix](data))
    return target


@pytest.mark.parametrize("suffix", READABLE)
@pytest.mark.parametrize("corpus_format", sorted(TEXTS))
def test_compressed_files_give_the_plain_files_documents(tmp_path, corpus_format, suffix):
    plain = tmp_path / "corpus.txt"
    plain.write_bytes(TEXTS[corpus_format])
    packed = compress(plain, TEXTS[corpus_format], suffix)
    config = {"files": [str(plain)], "format": corpus_format}
    expected = documents(corpus_documents(corpus_config("files", **config), str(tmp_path)))
    assert len(expected) >= 1
    config["files"] = [str(packed)]
    assert documents(corpus_documents(corpus_config("files", **config), str(tmp_path))) \
        == expected


@pytest.fixture(scope="module")
def demo_corpus(tmp_path_factory) -> Path:
    """The demo generator's corpus (Google's format) and the vocab.txt beside it."""
    return ensure_demo_corpus(tmp_path_factory.mktemp("demo") / "corpus.txt", dict(
        num_documents=40, min_sentences=4, max_sentences=8, min_words=5, max_words=10,
        num_topics=4, seed=1))


def prepared(tmp_path: Path, corpus: Path, vocab: Path):
    cfg = compose_config(small_run(**{
        "corpus": "files", "corpus.files": f"[{corpus}]", "model.tokenizer": str(vocab),
        "masking": "static", "masking.dupe_factor": 2, "objective": "mlm_nsp",
        "heldout.fraction": 0.2, "cache_dir": str(tmp_path / "cache")}))
    return prepare_pretraining_data(cfg,
                                    build_training_arguments(cfg, tmp_path, []))


@pytest.mark.slow
@pytest.mark.parametrize("suffix", READABLE)
def test_the_same_text_compressed_gives_the_same_pretraining_instances(tmp_path, demo_corpus,
                                                                       suffix):
    packed = compress(tmp_path / "corpus.txt", demo_corpus.read_bytes(), suffix)
    plain = prepared(tmp_path / "plain", demo_corpus, demo_corpus.parent)
    compressed = prepared(tmp_path / "compressed", packed, demo_corpus.parent)
    assert len(plain.train_dataset) > 50 and plain.heldout.documents > 0
    assert compressed.train_dataset.to_dict() == plain.train_dataset.to_dict()
    assert compressed.heldout.mlm.to_dict() == plain.heldout.mlm.to_dict()
    assert compressed.heldout.pairs.to_dict() == plain.heldout.pairs.to_dict()
    assert compressed.train_documents == plain.train_documents


def _zip(text: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("corpus.txt", text)
    return buffer.getvalue()


def _tar_gz(text: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        member = tarfile.TarInfo("corpus.txt")
        member.size = len(text)
        archive.addfile(member, io.BytesIO(text))
    return buffer.getvalue()


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02"
TEXT = TEXTS["google"]
BINARY = {
    "image.png": (PNG, "a PNG image"),
    "random.txt": (random.Random(0).randbytes(4096), "binary data"),
    "corpus.zip": (_zip(TEXT), "a zip archive"),
    "corpus.tar.gz": (_tar_gz(TEXT), r"\(gzip-compressed\): a tar archive"),
    "image.png.gz": (gzip.compress(PNG), r"\(gzip-compressed\): a PNG image"),
    # No NUL byte, but a control byte in every 20: not text either.
    "controls.txt": (b"".join(bytes([1]) + b"abcdefghijklmnopqrs" for _ in range(50)),
                     "50 control bytes in 1,000"),
    "utf16.txt": ("One sentence.\n".encode("utf-16"), "UTF-16 text"),
    "misnamed.gz": (TEXT, "named .gz but its content is not gzip data"),
    "truncated.xz": (lzma.compress(TEXT * 50)[:-30], "corrupt or truncated xz data"),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_files_are_refused_in_one_line_naming_them(tmp_path, name):
    content, reason = BINARY[name]
    good = tmp_path / "good.txt"
    good.write_bytes(TEXT)
    bad = tmp_path / name
    bad.write_bytes(content)
    corpus = corpus_config("files", files=[str(good), str(bad)])
    with pytest.raises(BertkitError) as raised:
        corpus_documents(corpus, str(tmp_path / "cache"))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(str(bad))
    assert raised.match(reason)
    # Through corpus.parts too, among files of another format.
    corpus = corpus_config("wikitext2_gutenberg")
    corpus.parts[0].files = [str(good)]
    corpus.parts[1].files = [str(bad)]
    with pytest.raises(BertkitError, match=f"^{bad}"):
        corpus_documents(corpus, str(tmp_path / "cache"))


@pytest.mark.skipif(ZSTD_READER, reason="a zstd reader is installed")
def test_zstd_without_a_reader_is_refused_with_the_fix(tmp_path):
    packed = tmp_path / "corpus.txt.zst"
    packed.write_bytes(_zstd(TEXT))
    with pytest.raises(BertkitError, match=rf"^{packed}: zstd-compressed; .*zstandard"):
        corpus_documents(corpus_config("files", files=[str(packed)]), str(tmp_path))


def test_an_empty_file_among_the_parts_is_named_in_a_warning(tmp_path, caplog):
    wiki = tmp_path / "wiki.raw"
    wiki.write_text(" = Title = \n \n Line one . Line two .\n")
    book = tmp_path / "book.txt.gz"
    book.write_bytes(gzip.compress(b"The cat sat down. It purred.\n"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    empty_gz = tmp_path / "empty.txt.gz"
    empty_gz.write_bytes(gzip.compress(b"\n \n"))  # decompresses to blank lines only
    corpus = corpus_config("wikitext2_gutenberg")
    corpus.parts[0].files = [str(wiki)]
    corpus.parts[1].files = [str(book), str(empty), str(empty_gz)]
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        result = corpus_documents(corpus, str(tmp_path / "cache"))
    assert documents(result) == [["Line one .", "Line two ."],
                                 ["The cat sat down.", "It purred."]]
    warned = [record.getMessage() for record in caplog.records
              if record.levelno == logging.WARNING]
    assert len(warned) == 2
    assert warned[0].startswith(f"{empty}: no document") and str(empty_gz) in warned[1]


def test_the_cache_key_of_a_compressed_file_follows_its_content(tmp_path):
    """gzip keeps its source's mtime, and equal-length texts compress to equal sizes: a new
    file of the same name, size and mtime must still be read anew."""
    path = tmp_path / "corpus.txt.gz"
    old, new = b"Old words here.\n\nAnd more.\n", b"New words here.\n\nAnd more.\n"
    path.write_bytes(gzip.compress(old, mtime=0))
    os.utime(path, ns=(10**18, 10**18))
    corpus = corpus_config("files", files=[str(path)])
    before = files_fingerprint([path], "google", None)
    assert documents(corpus_documents(corpus, str(tmp_path / "cache")))[0] == ["Old words here."]
    path.write_bytes(gzip.compress(new, mtime=0))
    os.utime(path, ns=(10**18, 10**18))
    stat = path.stat()
    assert (stat.st_size, stat.st_mtime_ns) == (len(gzip.compress(old, mtime=0)), 10**18)
    assert files_fingerprint([path], "google", None) != before
    assert documents(corpus_documents(corpus, str(tmp_path / "cache")))[0] == ["New words here."]


@pytest.mark.slow  # a pretraining run
def test_a_tiny_pretraining_run_on_a_gzip_corpus_trains(tmp_path, demo_corpus):
    packed = compress(tmp_path / "corpus.txt", demo_corpus.read_bytes(), ".gz")
    summary = pretrain(compose_config(small_run(**{
        "corpus": "files", "corpus.files": f"[{packed}]",
        "model.tokenizer": str(demo_corpus.parent), "masking": "dynamic",
        "trainer.max_steps": 30, "trainer.warmup_steps": 2, "trainer.logging_steps": 1,
        "heldout.every_seconds": "null", "heldout.every_steps": 30,
        "cache_dir": str(tmp_path / "cache")})), tmp_path / "run")
    assert summary["train"]["steps"] == 30
    losses = [line["mlm_loss"] for line in summary["log"]]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3
    heldout = summary["heldout"]["curve"]
    assert heldout[-1]["mlm_loss"] < heldout[0]["mlm_loss"]


def test_text_that_starts_like_bzip2_magic_is_read_as_text(tmp_path):
    """bzip2's magic is "BZh" and a digit: prose that starts "BZh" is not taken for it."""
    path = tmp_path / "corpus.txt"
    path.write_text("BZh is how the file starts.\nIt is text.\n")
    result = corpus_documents(corpus_config("files", files=[str(path)]), str(tmp_path))
    assert documents(result) == [["BZh is how the file starts.", "It is text."]]

"""Raw pretraining text as documents, each a list of sentences.

Formats:
  google:   Google's format: one sentence per line, a blank line between documents.
  wikitext: raw WikiText: a ` = Title = ` heading starts an article, ` = = Section = = `
            headings are dropped, every other line is a paragraph split into sentences.
  text:     plain prose, one document per file (a book): paragraphs are separated by blank
            lines, a paragraph's hard-wrapped lines are joined and split into sentences.
Files are read as UTF-8, or as Latin-1 when a file is not valid UTF-8 (old Gutenberg texts);
gzip, bzip2, xz (and zstd) files are decompressed on the fly; other binary files are refused.
Sentences are split with blingfire (Microsoft's rule-based splitter: offline, ~15 MB/s here).
"""

from __future__ import annotations

import codecs
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import blingfire

from bertkit.config_schema import check_setting
from bertkit.data.binary_content import TextCheck
from bertkit.data.compressed_files import (
    READABLE,
    compression_of,
    read_chunks,
    text_stream,
)
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

FORMATS = ("google", "wikitext", "text")
ARTICLE_TITLE = re.compile(r"^ ?= [^=].* = ?$")
SECTION_TITLE = re.compile(r"^ ?(= ){2,}.* (= ?){2,}$")
# WikiText escapes in-number punctuation and hyphens as " @-@ " etc.
WIKITEXT_ESCAPES = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def split_sentences(paragraph: str) -> list[str]:
    text = paragraph.strip()
    return [s for s in blingfire.text_to_sentences(text).split("\n") if s.strip()] if text else []


def file_encoding(path: Path) -> str:
    """utf-8-sig, or latin-1 when the file is not valid UTF-8. Every byte is valid Latin-1, so
    such files decode whole and right (byte 0xE6 -> æ) where errors="replace" garbles them.
    Checks the whole file first (a second fast pass) so one file never mixes two decodings,
    and refuses it there when it is not text (an image, an archive, random bytes)."""
    compression = compression_of(path)
    name = f"{path} ({compression}-compressed)" if compression else str(path)
    check = TextCheck(name, f"corpus files are text, plain or compressed with {READABLE}")
    decoder = codecs.getincrementaldecoder("utf-8")()
    utf8 = True
    for chunk in read_chunks(path):
        check.feed(chunk)
        if utf8:
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                utf8 = False
    check.finish()
    if utf8:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    return "utf-8-sig" if utf8 else "latin-1"


def _lines(path: Path) -> Iterator[str]:
    if not path.is_file():
        raise BertkitError(f"{path}: corpus file not found")
    with text_stream(path, file_encoding(path)) as handle:
        for line in handle:
            yield line.rstrip("\r\n")


def google_documents(path: Path) -> Iterator[list[str]]:
    document: list[str] = []
    for line in _lines(path):
        if line.strip():
            document.append(line.strip())
        elif document:
            yield document
            document = []
    if document:
        yield document


def wikitext_documents(path: Path) -> Iterator[list[str]]:
    document: list[str] = []
    for line in _lines(path):
        if SECTION_TITLE.match(line):
            continue
        if ARTICLE_TITLE.match(line):
            if document:
                yield document
            document = []
        elif line.strip():
            for escaped, plain in WIKITEXT_ESCAPES.items():
                line = line.replace(escaped, plain)
            document.extend(split_sentences(line))
    if document:
        yield document


def text_documents(path: Path) -> Iterator[list[str]]:
    """The whole file is one document: books keep their sentences together for NSP."""
    document: list[str] = []
    paragraph: list[str] = []
    for line in _lines(path):
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            document.extend(split_sentences(" ".join(paragraph)))
            paragraph = []
    if paragraph:
        document.extend(split_sentences(" ".join(paragraph)))
    if document:
        yield document


READERS = {"google": google_documents, "wikitext": wikitext_documents, "text": text_documents}


def read_documents(paths: list[str | Path], corpus_format: str) -> Iterator[list[str]]:
    check_setting("corpus.format", corpus_format)
    reader = READERS[corpus_format]
    for path in paths:
        documents = 0
        for document in reader(Path(path)):
            documents += 1
            yield document
        if documents == 0:  # often a failed download or an empty shard: say which
            logger.warning("%s: no document in corpus.format=%s (the file is empty or holds "
                           "only blank lines); skipped", path, corpus_format)

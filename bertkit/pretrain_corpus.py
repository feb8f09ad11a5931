"""Raw pretraining text as documents, each a list of sentences.

Formats:
  google:   Google's format: one sentence per line, a blank line between documents.
  wikitext: raw WikiText: a ` = Title = ` heading starts an article, ` = = Section = = `
            headings are dropped, every other line is a paragraph split into sentences.
Sentences are split with blingfire (Microsoft's rule-based splitter: offline, ~15 MB/s here).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import blingfire

from bertkit.errors import BertkitError

FORMATS = ("google", "wikitext")
ARTICLE_TITLE = re.compile(r"^ ?= [^=].* = ?$")
SECTION_TITLE = re.compile(r"^ ?(= ){2,}.* (= ?){2,}$")
# WikiText escapes in-number punctuation and hyphens as " @-@ " etc.
WIKITEXT_ESCAPES = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def split_sentences(paragraph: str) -> list[str]:
    text = paragraph.strip()
    return [s for s in blingfire.text_to_sentences(text).split("\n") if s.strip()] if text else []


def _lines(path: Path) -> Iterator[str]:
    if not path.is_file():
        raise BertkitError(f"{path}: corpus file not found")
    with open(path, encoding="utf-8", errors="replace") as handle:
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


def read_documents(paths: list[str | Path], corpus_format: str) -> Iterator[list[str]]:
    if corpus_format not in FORMATS:
        raise BertkitError(f"corpus.format={corpus_format!r}: expected one of {', '.join(FORMATS)}")
    reader = google_documents if corpus_format == "google" else wikitext_documents
    for path in paths:
        yield from reader(Path(path))

"""Corpus readers: Google's one-sentence-per-line format, raw WikiText and plain prose books;
UTF-8 with a Latin-1 fallback."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import read_documents, split_sentences
from tests.conftest import real_data_dir


def test_google_format_blank_lines_separate_documents(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First doc, one.\nFirst doc, two.\n\n\nSecond doc.\r\n\nThird, a.\nThird, b.")
    assert list(read_documents([path], "google")) == [
        ["First doc, one.", "First doc, two."], ["Second doc."], ["Third, a.", "Third, b."]]


def test_wikitext_titles_start_articles_and_paragraphs_are_split(tmp_path):
    path = tmp_path / "wiki.raw"
    path.write_text(
        " \n = Robert Boulter = \n \n"
        " Robert Boulter is an English actor . He had a guest role in 2000 .\n \n"
        " = = Career = = \n \n"
        " In 2006 he starred in a play by Mr. Smith . It ran 1 @,@ 000 nights .\n"
        " = Valkyria Chronicles = \n \n"
        " The game is a tactical role @-@ playing game .\n")
    documents = list(read_documents([path], "wikitext"))
    assert documents == [
        ["Robert Boulter is an English actor .", "He had a guest role in 2000 .",
         "In 2006 he starred in a play by Mr. Smith .", "It ran 1,000 nights ."],
        ["The game is a tactical role-playing game ."],
    ]


def test_text_format_one_document_per_file_paragraphs_joined_then_split(tmp_path):
    # A Gutenberg-style book: title line, CRLF endings, a Latin-1 byte (0xE6 is æ), a
    # separator line holding only spaces and a tab, and prose hard-wrapped over lines.
    book = tmp_path / "book.txt"
    book.write_bytes(b"[A Roman Play by Someone 1599]\r\n\r\n"
                     b"  C\xe6sar came home. He was\r\ntired after the\r\nlong war.\r\n"
                     b" \t \r\n"
                     b"A second paragraph\r\nends here.\r\n")
    other = tmp_path / "other.txt"
    other.write_text("Caf\u00e9 life is na\u00efve. It is.\n   \nLast one.", encoding="utf-8")
    assert list(read_documents([book, other], "text")) == [
        ["[A Roman Play by Someone 1599]", "C\u00e6sar came home.",
         "He was tired after the long war.", "A second paragraph ends here."],
        ["Caf\u00e9 life is na\u00efve.", "It is.", "Last one."],
    ]


def test_latin1_fallback_for_every_format_and_empty_text_file(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"Na\xefve line.\n\nC\xe6sar line.\n")
    assert list(read_documents([latin1], "google")) == [["Na\u00efve line."], ["C\u00e6sar line."]]
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n")
    assert list(read_documents([empty], "text")) == []


def test_splitter_keeps_abbreviations_together():
    assert split_sentences("Dr. Smith went to Washington. He arrived at 5 p.m. on Monday.") == [
        "Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday."]


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(BertkitError, match="corpus.format"):
        list(read_documents([tmp_path / "x"], "markdown"))
    with pytest.raises(BertkitError, match="corpus file not found"):
        list(read_documents([tmp_path / "x"], "google"))


@pytest.mark.real_data
def test_real_wikitext_and_google_sample():
    root = real_data_dir()
    articles = list(read_documents([root / "wikitext-2-raw" / "wiki.valid.raw"], "wikitext"))
    # WikiText-2 valid holds 60 articles.
    assert len(articles) == 60
    assert all(" @-@ " not in s for article in articles for s in article)
    assert sum(len(a) for a in articles) > 3000
    sample = list(read_documents([root / "pretrain-sample" / "bert_sample_text.txt"], "google"))
    assert len(sample) == 3 and sum(len(d) for d in sample) == 33 - 3 + 1


@pytest.mark.real_data
def test_real_gutenberg_books_one_document_each():
    root = real_data_dir() / "corpus" / "nltk-gutenberg"
    paths = sorted(root.glob("*.txt"))  # the README is not a book
    assert len(paths) == 14
    books = list(read_documents(paths, "text"))
    assert len(books) == 14
    by_name = {path.name: book for path, book in zip(paths, books, strict=True)}
    caesar = by_name["shakespeare-caesar.txt"]  # Latin-1: "C\xe6sar" twice
    assert caesar[0] == "[The Tragedie of Julius Caesar by William Shakespeare 1599]"
    assert "Ant. C\u00e6sar, my Lord" in caesar
    assert sum("C\u00e6sar" in sentence for sentence in caesar) == 2
    # Hard-wrapped lines come back as whole sentences.
    assert ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
            "disposition, seemed to unite some of the best blessings of existence; and had lived "
            "nearly twenty-one years in the world with very little to distress or vex her."
            ) in by_name["austen-emma.txt"]
    sentences = [sentence for book in books for sentence in book]
    assert not any("\r" in s or "\ufffd" in s for s in sentences)  # CRLF (Moby Dick), no garbling
    # ~1.1M words: about 52k sentences, the shortest book (Blake) a few hundred.
    assert 40_000 < len(sentences) < 70_000
    assert all(300 < len(book) < 15_000 for book in books)

"""Corpus readers: Google's one-sentence-per-line format and raw WikiText."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.pretrain_corpus import read_documents, split_sentences
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

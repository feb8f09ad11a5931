"""The corpus as a datasets dataset of documents: local files through an Arrow cache keyed by
the files' paths, sizes and mtimes; Hub datasets (patched, no network) split into sentences."""

from __future__ import annotations

import os

import datasets
import pytest
from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import CorpusSchema, check_ranges
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.pretraining import corpora as corpus_source
from bertkit.pretraining import corpora as pretrain_corpus
from bertkit.pretraining.corpora import corpus_documents
from tests.conftest import real_data_dir

ARTICLES = [
    "Anarchism is a political philosophy. It is sceptical of authority.\n\nHistory\n"
    "Dr. Smith wrote about it in 1890. His work was read widely.",
    "Albedo is a measure of reflection. It is a ratio.\n\n",
    "",  # an empty article gives no document
]
ARTICLE_SENTENCES = [
    ["Anarchism is a political philosophy.", "It is sceptical of authority.", "History",
     "Dr. Smith wrote about it in 1890.", "His work was read widely."],
    ["Albedo is a measure of reflection.", "It is a ratio."],
]
BOOK_ROWS = ["The cat sat down.", "It purred.", "The dog ran off.", "It barked.", "The end."]


def corpus_config(preset: str, **overrides) -> DictConfig:
    """conf/corpus/<preset>.yaml over its schema's defaults (what the group's node holds
    before a recipe's own values), with overrides (dotted keys)."""
    corpus = OmegaConf.merge(OmegaConf.structured(CorpusSchema),
                             OmegaConf.load(os.path.join(config_dir(), "corpus", f"{preset}.yaml")))
    for key, value in overrides.items():
        OmegaConf.update(corpus, key.replace("__", "."), value)
    return corpus


def checked(corpus: DictConfig) -> DictConfig:
    """The corpus node held to the schema, as every job's config is before it starts."""
    check_ranges(OmegaConf.create({"corpus": corpus}))
    return corpus


def documents(dataset) -> list[list[str]]:
    return [row["sentences"] for row in dataset]


# Local files


def test_local_google_and_wikitext_files(tmp_path):
    google = tmp_path / "corpus.txt"
    google.write_text("One a.\nOne b.\n\nTwo a.\n")
    wiki = tmp_path / "wiki.raw"
    wiki.write_text(" = Title = \n \n Line one . Line two .\n = = Part = = \n Three @-@ four .\n")
    result = corpus_documents(corpus_config("files", files=[str(google)]), str(tmp_path))
    assert isinstance(result, datasets.Dataset) and result.column_names == ["sentences"]
    assert documents(result) == [["One a.", "One b."], ["Two a."]]
    assert all(f["filename"].startswith(str(tmp_path / "corpus")) for f in result.cache_files)
    result = corpus_documents(corpus_config("files", files=[str(wiki)], format="wikitext"),
                              str(tmp_path))
    assert documents(result) == [["Line one .", "Line two .", "Three-four ."]]


def test_parts_read_files_of_several_formats_into_one_corpus(tmp_path):
    """corpus.parts (corpus=wikitext2_gutenberg): each part in its own format, in order; a
    changed part invalidates the cache."""
    wiki = tmp_path / "wiki.raw"
    wiki.write_text(" = Title = \n \n Line one . Line two .\n")
    book = tmp_path / "book.txt"
    book.write_text("The cat sat down. It purred.\n\nThe end.\n")
    corpus = corpus_config("wikitext2_gutenberg")
    corpus.parts[0].files = [str(wiki)]
    corpus.parts[1].files = [str(book)]
    result = corpus_documents(corpus, str(tmp_path), num_proc=2)
    assert documents(result) == [["Line one .", "Line two ."],
                                 ["The cat sat down.", "It purred.", "The end."]]
    book.write_text("Another book.\n")
    assert documents(corpus_documents(corpus, str(tmp_path)))[1] == ["Another book."]
    corpus.parts[1].format = "unknown"
    with pytest.raises(BertkitError, match="corpus.format='unknown'"):
        corpus_documents(corpus, str(tmp_path))
    corpus.parts = [{"files": [str(book)]}]
    with pytest.raises(BertkitError, match=r"corpus.parts\[0\]"):
        corpus_documents(corpus, str(tmp_path))


def test_cache_is_reused_until_a_file_changes(tmp_path, monkeypatch):
    reads = []
    real_reader = pretrain_corpus.read_documents

    def counting_reader(paths, corpus_format):
        reads.append(list(paths))
        return real_reader(paths, corpus_format)

    monkeypatch.setattr(pretrain_corpus, "read_documents", counting_reader)
    path = tmp_path / "corpus.txt"
    path.write_text("Old one.\nOld two.\n")
    corpus = corpus_config("files", files=[str(path)])
    first = corpus_documents(corpus, str(tmp_path / "cache"))
    second = corpus_documents(corpus, str(tmp_path / "cache"))
    assert len(reads) == 1 and second.cache_files == first.cache_files
    assert second._fingerprint == first._fingerprint  # later map() caches are reused too
    path.write_text("New one.\n\nNew two, longer.\n")
    third = corpus_documents(corpus, str(tmp_path / "cache"))
    assert len(reads) == 2 and third.cache_files != first.cache_files
    assert documents(third) == [["New one."], ["New two, longer."]]


def test_globs_expand_sorted_without_duplicates(tmp_path):
    for name in ["b.txt", "a.txt", "c.md"]:
        (tmp_path / name).write_text(f"From {name}.\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.txt").write_text("From d.txt.\n")
    corpus = corpus_config("files", files=[str(tmp_path / "*.txt"), str(tmp_path / "a.txt"),
                                           str(tmp_path / "**" / "d.txt")])
    assert corpus_source.corpus_files(corpus) == [
        tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "sub" / "d.txt"]
    result = corpus_documents(corpus, str(tmp_path / "cache"))
    assert documents(result) == [["From a.txt."], ["From b.txt."], ["From d.txt."]]


def test_missing_files_and_empty_corpus_name_the_config_key(tmp_path):
    with pytest.raises(BertkitError, match=r"corpus\.files: .*nope\.txt: no such file"):
        corpus_documents(corpus_config("files", files=[str(tmp_path / "nope.txt")]), str(tmp_path))
    with pytest.raises(BertkitError, match=r"corpus\.files: the pattern .*\*\.raw matches no file"):
        corpus_documents(corpus_config("files", files=[str(tmp_path / "*.raw")]), str(tmp_path))
    with pytest.raises(BertkitError, match=r"corpus\.files is not set"):
        corpus_documents(corpus_config("files"), str(tmp_path))  # files: ???
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(BertkitError, match=r"blank\.txt\) hold no document"):
        corpus_documents(corpus_config("files", files=[str(tmp_path / "blank.txt")]),
                         str(tmp_path))
    with pytest.raises(BertkitError, match=r"corpus\.format='pdf'"):
        corpus_documents(corpus_config("files", files=[str(tmp_path / "blank.txt")],
                                       format="pdf"), str(tmp_path))
    with pytest.raises(BertkitError, match=r"^corpus\.source='s3': expected one of local"):
        corpus_documents(checked(corpus_config("files", source="s3")), str(tmp_path))


def test_max_documents_takes_the_first(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("One.\n\nTwo.\n\nThree.\n")
    corpus = corpus_config("files", files=[str(path)], max_documents=2)
    assert documents(corpus_documents(corpus, str(tmp_path))) == [["One."], ["Two."]]
    with pytest.raises(BertkitError, match=r"^corpus\.max_documents=0: expected null"):
        corpus_documents(checked(corpus_config("files", files=[str(path)], max_documents=0)),
                         str(tmp_path))


@pytest.mark.real_data
def test_real_gutenberg_preset_same_with_several_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKIT_DATA", str(real_data_dir()))
    corpus = corpus_config("gutenberg")
    one = corpus_documents(corpus, str(tmp_path / "one"))
    two = corpus_documents(corpus, str(tmp_path / "two"), num_proc=2)
    assert len(one) == 14 and len(two.cache_files) == 2
    assert one["sentences"] == two["sentences"]


# Hugging Face Hub (datasets.load_dataset patched)


def patch_hub(monkeypatch, table: dict, streaming_kind: str = "features") -> list:
    """load_dataset returns `table` as a Dataset, or for streaming=True an IterableDataset,
    with known features or ("generator") unknown until read, like some Hub streams."""
    calls = []

    def load_dataset(path, name=None, *, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        dataset = datasets.Dataset.from_dict(table)
        if not streaming:
            return dataset
        if streaming_kind == "generator":
            return datasets.IterableDataset.from_generator(lambda: iter(dataset))
        return dataset.to_iterable_dataset()

    monkeypatch.setattr(corpus_source.datasets, "load_dataset", load_dataset)
    return calls


def test_hub_articles_become_documents_of_sentences(monkeypatch):
    calls = patch_hub(monkeypatch, {"id": ["1", "2", "3"], "text": ARTICLES})
    result = corpus_documents(corpus_config("wikipedia", hub__streaming=False), "unused")
    assert calls == [("wikimedia/wikipedia", "20231101.en", "train", False)]
    assert isinstance(result, datasets.Dataset) and result.column_names == ["sentences"]
    assert documents(result) == ARTICLE_SENTENCES
    first = corpus_documents(corpus_config("wikipedia", hub__streaming=False, max_documents=1),
                             "unused")
    assert documents(first) == ARTICLE_SENTENCES[:1]


@pytest.mark.parametrize("streaming_kind", ["features", "generator"])
def test_hub_streaming_gives_an_iterable_dataset(monkeypatch, streaming_kind):
    calls = patch_hub(monkeypatch, {"id": ["1", "2", "3"], "text": ARTICLES}, streaming_kind)
    result = corpus_documents(corpus_config("wikipedia"), "unused")
    assert calls[0][3] is True
    assert isinstance(result, datasets.IterableDataset)
    assert result.column_names == ["sentences"]
    assert documents(result) == ARTICLE_SENTENCES
    first = corpus_documents(corpus_config("wikipedia", max_documents=1), "unused")
    assert documents(first) == ARTICLE_SENTENCES[:1]


def test_missing_text_column_lists_the_columns(monkeypatch):
    patch_hub(monkeypatch, {"id": ["1"], "article": ["Text."]}, "generator")
    for streaming in (False, True):
        corpus = corpus_config("wikipedia", hub__streaming=streaming)
        with pytest.raises(BertkitError, match=r"corpus\.hub\.text_column='text'.*: id, article"):
            corpus_documents(corpus, "unused")


@pytest.mark.parametrize("streaming", [False, True])
def test_rows_per_document_groups_consecutive_rows(monkeypatch, streaming):
    patch_hub(monkeypatch, {"text": BOOK_ROWS})
    corpus = corpus_config("bookcorpus", hub__rows_per_document=2, hub__streaming=streaming)
    expected = [["The cat sat down.", "It purred."], ["The dog ran off.", "It barked."],
                ["The end."]]
    assert documents(corpus_documents(corpus, "unused")) == expected
    corpus.max_documents = 2
    assert documents(corpus_documents(corpus, "unused")) == expected[:2]
    corpus.max_documents = None
    corpus.hub.rows_per_document = 1  # BookCorpus rows alone: one-sentence documents
    assert documents(corpus_documents(corpus, "unused")) == [[row] for row in BOOK_ROWS]


def test_unreachable_hub_gives_one_message(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wikimedia/wikipedia' on the Hub (ConnectError)")

    monkeypatch.setattr(corpus_source.datasets, "load_dataset", offline)
    with pytest.raises(BertkitError, match=r"Hub could not be reached.*wikimedia/wikipedia.*"
                                           r"corpus\.source=local corpus\.files="):
        corpus_documents(corpus_config("wikipedia"), "unused")

"""The pretraining corpus (config node `corpus`) as a datasets dataset with one column,
`sentences`: a document's sentences, one list of strings per row.

Nothing holds the corpus in Python memory. Local files are read once into an Arrow cache under
<cache_dir>/corpus (written incrementally, then memory-mapped, so a corpus larger than memory
works) and reused while the files are unchanged; Hub datasets come from datasets.load_dataset,
as a lazy IterableDataset when corpus.hub.streaming is true.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError
from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import check_setting
from bertkit.data import binary_content, compressed_files
from bertkit.data.compressed_files import compressed_tail_digest
from bertkit.data.fingerprints import content_fingerprint, files_content_fingerprint
from bertkit.data.hub import require_hub, why_offline
from bertkit.errors import BertkitError
from bertkit.pretraining import corpus_formats as pretrain_corpus

FEATURES = datasets.Features({"sentences": datasets.Sequence(datasets.Value("string"))})
Documents = datasets.Dataset | datasets.IterableDataset


def corpus_documents(corpus: DictConfig, cache_dir: str,
                     num_proc: int | None = None) -> datasets.Dataset | datasets.IterableDataset:
    """The documents of corpus.source (local | hub), the first corpus.max_documents if set
    (the values' types and choices are the schema's: bertkit.config_schema.CorpusSchema)."""
    max_documents = corpus.max_documents
    if corpus.source == "hub":
        return hub_documents(corpus, num_proc, max_documents)
    return local_documents(corpus, cache_dir, num_proc, max_documents)


# Local files


def corpus_files(corpus: DictConfig) -> list[Path]:
    """corpus.files as absolute paths: globs expanded in sorted order, duplicates dropped."""
    if OmegaConf.is_missing(corpus, "files") or not corpus.files:
        raise BertkitError("corpus.files is not set: expected a list of files or glob patterns, "
                           "e.g. corpus.files='[data/part-*.txt]'")
    patterns = [corpus.files] if isinstance(corpus.files, str) else list(corpus.files)
    files: dict[Path, None] = {}
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        if glob.has_magic(expanded):
            matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise BertkitError(f"corpus.files: the pattern {pattern} matches no file")
        elif os.path.isfile(expanded):
            matches = [expanded]
        else:
            raise BertkitError(f"corpus.files: {pattern}: no such file")
        files.update((Path(match).resolve(), None) for match in matches)
    return list(files)


def files_fingerprint(files: list[Path], corpus_format: str, max_documents: int | None) -> str:
    """Paths, sizes and mtimes (not contents: a corpus may be many GB), a compressed file's
    last bytes (its checksum of the content), plus the reading rules, so an edited file or a
    changed reader is re-read and anything else comes from the cache."""
    state = {
        "files": [[str(path), path.stat().st_size, path.stat().st_mtime_ns,
                   compressed_tail_digest(path)] for path in files],
        "format": corpus_format,
        "max_documents": max_documents,
        "reader": hashlib.sha256(b"".join(Path(module.__file__).read_bytes() for module in (
            pretrain_corpus, compressed_files, binary_content))).hexdigest(),
        "blingfire": version("blingfire"),
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def corpus_input_fingerprints(corpus: DictConfig, cache_dir: str) -> dict[str, str]:
    """details.input_fingerprints of a local corpus (bertkit.data.fingerprints): each part's
    format and its files' contents in reading order, whatever their paths, under the key that
    names them (corpus.files, or corpus.parts). A Hub corpus is named by its id: none."""
    if corpus.source != "local":
        return {}
    key = "corpus.parts" if OmegaConf.select(corpus, "parts") else "corpus.files"
    return {key: content_fingerprint(*(
        part_of for part in corpus_parts(corpus)
        for part_of in (str(part.format), files_content_fingerprint(corpus_files(part),
                                                                    cache_dir))))}


def _generate(sources: list[tuple[list[str], str]], max_documents: int | None,
              fingerprint: str) -> Iterator[dict]:
    """`fingerprint` is unused here: being in gen_kwargs, it keys the Arrow cache."""
    documents = itertools.chain.from_iterable(
        pretrain_corpus.read_documents(paths, corpus_format) for paths, corpus_format in sources)
    for document in itertools.islice(documents, max_documents):
        yield {"sentences": document}


def corpus_parts(corpus: DictConfig) -> list[DictConfig]:
    """corpus.parts (files in several formats, e.g. WikiText articles and plain-text books), or
    the corpus itself as its one part (corpus.files in corpus.format)."""
    parts = OmegaConf.select(corpus, "parts")
    if not parts:
        return [corpus]
    for number, part in enumerate(parts):
        if not OmegaConf.is_dict(part) or "files" not in part or "format" not in part:
            raise BertkitError(f"corpus.parts[{number}]: expected {{format: ..., files: [...]}}")
    return list(parts)


def local_documents(corpus: DictConfig, cache_dir: str, num_proc: int | None = None,
                    max_documents: int | None = None) -> datasets.Dataset:
    sources = []
    for part in corpus_parts(corpus):
        # corpus.format is the schema's too; corpus.parts' formats (list items) are not.
        check_setting("corpus.format", part.format)
        sources.append(([str(path) for path in corpus_files(part)], part.format))
    files = [Path(path) for paths, _ in sources for path in paths]
    fingerprint = files_fingerprint(files, "+".join(fmt for _, fmt in sources), max_documents)
    # Several processes each read a share of the files (order kept); not with max_documents,
    # which counts across all files, nor with several parts.
    processes = min(num_proc or 1, len(files)) if max_documents is None and len(sources) == 1 \
        else 1
    if processes > 1:  # datasets shards list-valued gen_kwargs: one shard per file
        paths, corpus_format = sources[0]
        sources_kwarg = [([path], corpus_format) for path in paths]
    else:
        sources_kwarg = sources
    try:
        documents = datasets.Dataset.from_generator(
            _generate, features=FEATURES, cache_dir=str(Path(cache_dir) / "corpus"),
            gen_kwargs={"sources": sources_kwarg, "max_documents": max_documents,
                        "fingerprint": fingerprint},
            num_proc=processes if processes > 1 else None,
            # The key is exactly the files and reading rules, not a hash of _generate's code.
            fingerprint=fingerprint,
        )
    except DatasetGenerationError as err:  # a reader's BertkitError, wrapped by datasets
        if isinstance(err.__cause__, BertkitError):
            raise err.__cause__ from None
        raise
    except ValueError as err:  # datasets refuses a split of 0 rows ("corresponds to no data")
        if "no data" not in str(err):
            raise
        documents = None
    if documents is None or len(documents) == 0:
        raise BertkitError(f"corpus.files ({', '.join(map(str, files))}) hold no document in "
                           f"their corpus.format")
    return documents


# Hugging Face Hub


def text_sentences(text: str | None) -> list[str]:
    """A row's text as sentences: paragraphs at newlines, each split with blingfire."""
    return [s for line in (text or "").splitlines() for s in pretrain_corpus.split_sentences(line)]


def _group_rows(batch: dict, text_column: str) -> dict:
    return {text_column: ["\n".join(text or "" for text in batch[text_column])]}


def _split_rows(batch: dict, text_column: str) -> dict:
    documents = [text_sentences(text) for text in batch[text_column]]
    return {"sentences": [document for document in documents if document]}


def _is_network_error(err: Exception) -> bool:
    network_modules = ("httpx", "httpcore", "requests", "urllib3", "aiohttp")
    return isinstance(err, (ConnectionError, TimeoutError)) or any(
        type(err).__module__.startswith(module) for module in network_modules)


def _load_hub(hub: DictConfig, streaming: bool) -> Documents:
    online = require_hub()  # without the Hub: offline mode, no retries (bertkit.data.hub)
    try:
        return datasets.load_dataset(hub.path, hub.name, split=hub.split, streaming=streaming)
    except Exception as err:  # one message, not a Hub traceback
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if not online:
            reason = f"{why_offline()}; not in the Hub cache"
        if not online or _is_network_error(err):
            raise BertkitError(
                f"the Hugging Face Hub could not be reached for corpus.hub.path={hub.path} "
                f"({reason}). Without network, use local files: corpus.source=local "
                "corpus.files='[<file or glob>, ...]'") from None
        raise BertkitError(
            f"could not load the Hub dataset corpus.hub.path={hub.path} name={hub.name} "
            f"split={hub.split} ({reason})") from None


def hub_documents(corpus: DictConfig, num_proc: int | None = None,
                  max_documents: int | None = None) -> Documents:
    """Rows of corpus.hub.text_column as documents, corpus.hub.rows_per_document rows each.

    Grouping exists for datasets whose rows are single sentences (BookCorpus): one row per
    document would leave NSP no next sentence. Rows are grouped before splitting, in one
    process, so documents do not depend on num_proc; the splitting runs on num_proc processes.
    Documents without a sentence are dropped, so max_documents may give a few fewer.
    """
    hub = corpus.hub
    if not hub.path:
        raise BertkitError("corpus.source=hub needs corpus.hub.path (a Hub dataset id, "
                           "e.g. wikimedia/wikipedia)")
    rows = hub.rows_per_document
    streaming = hub.streaming
    raw = _load_hub(hub, streaming)
    text_column = hub.text_column
    columns = raw.column_names
    if columns is None:  # a stream whose features are only known once read
        first = next(iter(raw), None)
        columns = list(first) if first else []
    if text_column not in columns:
        raise BertkitError(f"corpus.hub.text_column={text_column!r}: {hub.path} has no such "
                           f"column; its columns: {', '.join(columns) or '(none)'}")
    raw = raw.select_columns([text_column])
    fn_kwargs = {"text_column": text_column}
    if streaming:
        if rows > 1:
            raw = raw.map(_group_rows, batched=True, batch_size=rows, fn_kwargs=fn_kwargs)
        documents = raw.map(_split_rows, batched=True, remove_columns=[text_column],
                            features=FEATURES, fn_kwargs=fn_kwargs)
        return documents if max_documents is None else documents.take(max_documents)
    if max_documents is not None:
        raw = raw.select(range(min(len(raw), max_documents * rows)))
    if rows > 1:
        raw = raw.map(_group_rows, batched=True, batch_size=rows, fn_kwargs=fn_kwargs,
                      desc=f"Grouping {rows} rows per document")
    documents = raw.map(_split_rows, batched=True, remove_columns=[text_column],
                        features=FEATURES, fn_kwargs=fn_kwargs, num_proc=num_proc,
                        desc="Splitting into sentences")
    if len(documents) == 0:
        raise BertkitError(f"corpus.hub.path={hub.path}: no document with text in column "
                           f"{text_column!r}")
    return documents

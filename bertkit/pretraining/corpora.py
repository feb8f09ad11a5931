"""The pretraining corpus (config node `corpus`) as a datasets dataset with one column,
`sentences`: a document's sentences, one list of strings per row. Read from local files in one
of FORMATS, from the Hugging Face Hub, or generated (the demo corpus, corpus=demo).

Nothing holds the corpus in Python memory. Local files are read once into an Arrow cache under
<cache_dir>/corpus (written incrementally, then memory-mapped, so a corpus larger than memory
works) and reused while the files are unchanged; Hub datasets come from datasets.load_dataset,
as a lazy IterableDataset when corpus.hub.streaming is true.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import json
import logging
import os
import random
import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import blingfire
import datasets
from datasets.exceptions import DatasetGenerationError
from omegaconf import DictConfig, OmegaConf

from bertkit.config_schema import check_setting
from bertkit.data import text_files
from bertkit.data.atomic_files import write_text_atomic
from bertkit.data.cache import content_fingerprint, files_content_fingerprint
from bertkit.data.task_data import require_hub, why_offline
from bertkit.data.text_files import (
    READABLE,
    TextCheck,
    compressed_tail_digest,
    compression_of,
    read_chunks,
    text_stream,
)
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

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
        "reader": hashlib.sha256(b"".join(Path(path).read_bytes() for path in (
            __file__, text_files.__file__))).hexdigest(),
        "blingfire": version("blingfire"),
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def corpus_input_fingerprints(corpus: DictConfig, cache_dir: str) -> dict[str, str]:
    """details.input_fingerprints of a local corpus (bertkit.data.cache): each part's
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
        read_documents(paths, corpus_format) for paths, corpus_format in sources)
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
    return [s for line in (text or "").splitlines() for s in split_sentences(line)]


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
    online = require_hub()  # without the Hub: offline mode, no retries (bertkit.data.task_data)
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


# File formats: raw pretraining text as documents, each a list of sentences.
#   google:   Google's format: one sentence per line, a blank line between documents.
#   wikitext: raw WikiText: a ` = Title = ` heading starts an article, ` = = Section = = `
#             headings are dropped, every other line is a paragraph split into sentences.
#   text:     plain prose, one document per file (a book): paragraphs are separated by blank
#             lines, a paragraph's hard-wrapped lines are joined and split into sentences.
# Files are read as UTF-8, or as Latin-1 when a file is not valid UTF-8 (old Gutenberg texts);
# gzip, bzip2, xz (and zstd) files are decompressed on the fly; other binary files are refused.
# Sentences are split with blingfire (Microsoft's rule-based splitter: offline, ~15 MB/s here).

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


# The demo corpus: a generated pretraining corpus, so that tests and the offline demo
# pretrain with no files at all. Written in Google's format (one sentence per line, a blank
# line between documents). Each document has a topic: its sentences take nouns, verbs and
# adjectives from that topic's words, and function words from lists shared by all topics, in a
# fixed grammar
# (determiner [adjective] noun verb determiner [adjective] noun, then prepositional phrases and
# adverbs). A sentence's subject is the previous sentence's object or subject, so consecutive
# sentences continue each other. A tiny BERT therefore learns masked words (grammar and topic
# predict them) and next-sentence prediction (a random sentence from another document rarely
# shares its topic, and never shares the repeated noun) within a few hundred steps.


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCTUATION = ["."]
DETERMINERS = ["the", "this", "that", "every", "one", "each", "another"]
PREPOSITIONS = ["near", "behind", "beside", "under", "above", "inside", "past", "toward", "with",
                "without"]
ADVERBS = ["again", "today", "slowly", "quietly", "quickly", "often", "carefully", "soon",
           "later", "twice"]
FUNCTION_WORDS = DETERMINERS + PREPOSITIONS + ADVERBS
# Each topic's nouns, transitive past-tense verbs and adjectives; no word is in two topics.
TOPICS: dict[str, dict[str, list[str]]] = {
    "sea": {
        "nouns": ["ship", "sailor", "captain", "harbor", "wave", "anchor", "island", "whale",
                  "dolphin", "lighthouse", "net", "fisherman", "shell", "reef"],
        "verbs": ["steered", "rowed", "anchored", "sailed", "spotted", "towed", "hauled", "moored"],
        "adjectives": ["salty", "stormy", "coastal", "tidal", "wet", "blue", "sandy", "nautical"],
    },
    "forest": {
        "nouns": ["tree", "owl", "fox", "deer", "oak", "pine", "squirrel", "mushroom", "branch",
                  "moss", "hunter", "trail", "bear", "acorn"],
        "verbs": ["climbed", "hid", "chased", "sniffed", "gathered", "buried", "followed",
                  "tracked"],
        "adjectives": ["leafy", "shady", "wild", "mossy", "tall", "green", "dense", "ancient"],
    },
    "kitchen": {
        "nouns": ["cook", "chef", "pan", "pot", "oven", "knife", "onion", "soup", "bread", "spoon",
                  "plate", "sauce", "butter", "stove"],
        "verbs": ["stirred", "chopped", "baked", "boiled", "tasted", "seasoned", "sliced", "fried"],
        "adjectives": ["hot", "spicy", "fresh", "crispy", "sweet", "sour", "greasy", "tender"],
    },
    "city": {
        "nouns": ["taxi", "bus", "driver", "street", "tower", "mayor", "bridge", "subway", "shop",
                  "crowd", "office", "banker", "traffic", "sidewalk"],
        "verbs": ["parked", "crossed", "built", "closed", "opened", "managed", "passed",
                  "blocked"],
        "adjectives": ["busy", "noisy", "crowded", "urban", "modern", "concrete", "narrow",
                       "expensive"],
    },
    "farm": {
        "nouns": ["farmer", "cow", "barn", "tractor", "horse", "sheep", "pig", "hay", "field",
                  "fence", "goat", "chicken", "plow", "wheat"],
        "verbs": ["milked", "plowed", "fed", "harvested", "herded", "sheared", "planted",
                  "watered"],
        "adjectives": ["muddy", "rural", "dusty", "ripe", "golden", "fat", "woolly", "rusty"],
    },
    "space": {
        "nouns": ["rocket", "astronaut", "planet", "star", "moon", "comet", "orbit", "satellite",
                  "galaxy", "telescope", "asteroid", "crater", "capsule", "alien"],
        "verbs": ["launched", "orbited", "observed", "landed", "explored", "photographed",
                  "circled", "detected"],
        "adjectives": ["distant", "cosmic", "lunar", "orbital", "bright", "frozen", "silent",
                       "vast"],
    },
    "school": {
        "nouns": ["teacher", "student", "pupil", "lesson", "book", "desk", "pencil", "chalk",
                  "classroom", "exam", "homework", "principal", "library", "notebook"],
        "verbs": ["read", "wrote", "studied", "graded", "taught", "copied", "erased",
                  "memorized"],
        "adjectives": ["clever", "curious", "difficult", "easy", "strict", "boring", "neat",
                       "diligent"],
    },
    "music": {
        "nouns": ["guitar", "piano", "drum", "singer", "band", "song", "violin", "melody",
                  "concert", "drummer", "choir", "trumpet", "rhythm", "stage"],
        "verbs": ["played", "sang", "tuned", "strummed", "composed", "rehearsed", "recorded",
                  "performed"],
        "adjectives": ["loud", "soft", "musical", "catchy", "harmonic", "acoustic", "lively",
                       "melodic"],
    },
    "hospital": {
        "nouns": ["doctor", "nurse", "patient", "surgeon", "bandage", "medicine", "wound",
                  "ambulance", "clinic", "fever", "pill", "syringe", "ward", "stretcher"],
        "verbs": ["treated", "examined", "healed", "cured", "bandaged", "injected", "diagnosed",
                  "checked"],
        "adjectives": ["sick", "injured", "sterile", "medical", "pale", "weak", "feverish",
                       "healthy"],
    },
    "mountain": {
        "nouns": ["climber", "peak", "summit", "cliff", "rope", "glacier", "ridge", "boulder",
                  "valley", "cave", "avalanche", "eagle", "tent", "snow"],
        "verbs": ["scaled", "reached", "descended", "pitched", "traversed", "conquered", "mapped",
                  "surveyed"],
        "adjectives": ["steep", "rocky", "icy", "snowy", "windy", "alpine", "high", "cold"],
    },
}
# determiner noun verb determiner noun: the shortest sentence the grammar makes.
CORE_WORDS = 5


class _NounPhrase:
    def __init__(self, determiner: str, noun: str) -> None:
        self.determiner, self.adjective, self.noun = determiner, None, noun

    def words(self) -> list[str]:
        return [self.determiner] + ([self.adjective] if self.adjective else []) + [self.noun]


def _sentence(rng: random.Random, topic: dict[str, list[str]], subject: str, length: int,
              continued: bool) -> tuple[str, str]:
    """One sentence of exactly `length` words about `subject`; returns it and its object."""
    obj = rng.choice([noun for noun in topic["nouns"] if noun != subject])
    # "the" for the noun carried over from the previous sentence, as English marks given things.
    phrases = [_NounPhrase("the" if continued else rng.choice(DETERMINERS), subject),
               _NounPhrase(rng.choice(DETERMINERS), obj)]
    verb = rng.choice(topic["verbs"])
    prepositional: list[tuple[str, _NounPhrase]] = []
    adverbs: list[str] = []
    count = CORE_WORDS
    while count < length:
        bare = [phrase for phrase in phrases if phrase.adjective is None]
        choices = (["preposition"] if length - count >= 3 else []) + (["adjective"] if bare else [])
        if not adverbs or not choices:
            choices.append("adverb")
        choice = rng.choice(choices)
        if choice == "preposition":
            phrase = _NounPhrase(rng.choice(DETERMINERS), rng.choice(topic["nouns"]))
            prepositional.append((rng.choice(PREPOSITIONS), phrase))
            phrases.append(phrase)
            count += 3
        elif choice == "adjective":
            rng.choice(bare).adjective = rng.choice(topic["adjectives"])
            count += 1
        else:
            adverbs.append(rng.choice(ADVERBS))
            count += 1
    words = phrases[0].words() + [verb] + phrases[1].words()
    for preposition, phrase in prepositional:
        words += [preposition] + phrase.words()
    return " ".join(words + adverbs) + ".", obj


def _document(rng: random.Random, topic: dict[str, list[str]], num_sentences: int,
              min_words: int, max_words: int) -> list[str]:
    sentences: list[str] = []
    subject = rng.choice(topic["nouns"])
    for index in range(num_sentences):
        sentence, obj = _sentence(rng, topic, subject, rng.randint(min_words, max_words),
                                  continued=index > 0)
        sentences.append(sentence)
        # The next sentence goes on about this one's object, or stays with its subject.
        subject = obj if rng.random() < 0.7 else subject
    return sentences


def _check(num_documents: int, min_sentences: int, max_sentences: int, min_words: int,
           max_words: int, num_topics: int) -> None:
    key = "corpus.synthetic"
    check_setting(f"{key}.num_documents", num_documents)  # the schema's range
    if not 1 <= min_sentences <= max_sentences:
        raise BertkitError(f"{key}.min_sentences={min_sentences}, max_sentences={max_sentences}: "
                           f"need 1 <= min_sentences <= max_sentences")
    if not CORE_WORDS <= min_words <= max_words:
        raise BertkitError(f"{key}.min_words={min_words}, max_words={max_words}: need "
                           f"{CORE_WORDS} <= min_words <= max_words (the shortest sentence)")
    if not 1 <= num_topics <= len(TOPICS):
        raise BertkitError(f"{key}.num_topics={num_topics}: must be between 1 and {len(TOPICS)}")


def write_demo_corpus(path: Path, *, num_documents: int, min_sentences: int, max_sentences: int,
                      min_words: int, max_words: int, num_topics: int, seed: int) -> Path:
    """Write the corpus to path atomically; the same settings always give the same bytes."""
    _check(num_documents, min_sentences, max_sentences, min_words, max_words, num_topics)
    rng = random.Random(seed)
    topics = list(TOPICS.values())[:num_topics]
    documents = [
        _document(rng, rng.choice(topics), rng.randint(min_sentences, max_sentences),
                  min_words, max_words)
        for _ in range(num_documents)
    ]
    return write_text_atomic(path, "\n\n".join("\n".join(doc) for doc in documents) + "\n")


def demo_vocabulary() -> list[str]:
    """A whole-word WordPiece vocab: special tokens first ([PAD] is id 0), then every word."""
    words = set(FUNCTION_WORDS)
    for topic in TOPICS.values():
        for word_list in topic.values():
            words.update(word_list)
    return SPECIAL_TOKENS + PUNCTUATION + sorted(words)


def ensure_demo_corpus(path: str | Path, settings: dict) -> Path:
    """Write the corpus, and vocab.txt beside it, unless they are already there."""
    path = Path(path)
    if not path.is_file():
        write_demo_corpus(path, **settings)
    vocab = path.parent / "vocab.txt"
    if not vocab.is_file():
        write_text_atomic(vocab, "\n".join(demo_vocabulary()) + "\n")
    return path

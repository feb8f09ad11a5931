"""Sentences of words -> model inputs with WordPiece-aligned labels, and predictions back to words.

As in the paper (section 5.3): each word is labelled on its first sub-token, the other
sub-tokens get -100 (ignored by the loss); task.label_all_subtokens labels them too, the
continuation pieces of a B-X word with I-X. Predictions are read at each word's first
sub-token.

A feature is [CLS] left context, target words, right context [SEP] in at most max_seq_length
tokens; only the target words carry labels. The target is a whole sentence, or, for a
sentence longer than one sequence, consecutive pieces of it: every word of every sentence is
predicted and scored. Context is made of whole words, the nearest first, each from the side
with fewer context tokens so far (left on a tie), a side ending at its first word that does
not fit: the rest of the sentence, and with
task.document_context also the neighbouring sentences of the same document (the paper's
"maximal document context"). Without document context, a sentence that fits has no context.

No padding here: the collator pads each batch. Features are cached on disk by data,
tokenizer and settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from bertkit.errors import BertkitError
from bertkit.tasks.ner.files import NO_DOCUMENT

logger = logging.getLogger(__name__)

IGNORED = -100
# sentence: row of the split; word_positions: token position of each target word's first
# sub-token (-1 for a word with no sub-token); word_labels: the target words' gold label ids.
DECODING_COLUMNS = ("sentence", "word_positions", "word_labels")
_IDS = datasets.List(datasets.Value("int64"))
FEATURES = datasets.Features({
    "input_ids": _IDS, "token_type_ids": _IDS, "attention_mask": _IDS, "labels": _IDS,
    "length": datasets.Value("int64"), "sentence": datasets.Value("int64"),
    "word_positions": _IDS, "word_labels": _IDS,
})


def continuation_labels(labels: Sequence[str]) -> list[int]:
    """Label id -> the id of its continuation pieces (B-X -> I-X, anything else unchanged)."""
    ids = {label: i for i, label in enumerate(labels)}
    out = []
    for label in labels:
        if label.startswith("B-"):
            if f"I-{label[2:]}" not in ids:
                raise BertkitError(f"task.labels has {label} but no I-{label[2:]}: IOB2 needs "
                                   f"both for every entity type")
            out.append(ids[f"I-{label[2:]}"])
        else:
            out.append(ids[label])
    return out


def word_pieces(sentences: Sequence[Sequence[str]],
                tokenizer: PreTrainedTokenizerBase) -> list[list[list[int]]]:
    """Per sentence, per word, its WordPiece ids (an empty list for a word the tokenizer
    drops, e.g. a lone control character)."""
    if not tokenizer.is_fast:
        raise BertkitError("NER features need a fast tokenizer (word ids): give model.tokenizer "
                           "a directory with vocab.txt or tokenizer.json")
    out: list[list[list[int]]] = []
    step = 2000
    for begin in range(0, len(sentences), step):
        batch = [list(words) for words in sentences[begin:begin + step]]
        encoded = tokenizer(batch, is_split_into_words=True, add_special_tokens=False,
                            verbose=False)
        for i, words in enumerate(batch):
            pieces: list[list[int]] = [[] for _ in words]
            for token_id, word in zip(encoded["input_ids"][i], encoded.word_ids(i), strict=True):
                pieces[word].append(token_id)
            out.append(pieces)
    return out


def _chunks(lengths: Sequence[int], room: int) -> list[tuple[int, int]]:
    """Consecutive word ranges [a, b) whose pieces fit in room (a single longer word alone)."""
    chunks, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if used + n > room and i > start:
            chunks.append((start, i))
            start, used = i, 0
        used += n
    chunks.append((start, len(lengths)))
    return chunks


def _context(lengths: Sequence[int], start: int, stop: int, room: int) -> tuple[int, int]:
    """Word range [left, right) around the target [start, stop) whose pieces fit in room:
    whole words, taken alternately from the side with fewer context tokens so far (left on
    a tie), each side ending at the first word that does not fit."""
    left, right = start, stop
    left_used = right_used = 0
    left_open, right_open = left > 0, right < len(lengths)
    while left_open or right_open:
        if left_open and (not right_open or left_used <= right_used):
            n = lengths[left - 1]
            if n > room:
                left_open = False
                continue
            left, left_used, room = left - 1, left_used + n, room - n
            left_open = left > 0
        else:
            n = lengths[right]
            if n > room:
                right_open = False
                continue
            right, right_used, room = right + 1, right_used + n, room - n
            right_open = right < len(lengths)
    return left, right


def build_features(
    sentences: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    label_all_subtokens: bool = False,
    document_context: bool = False,
    continuation: Sequence[int] | None = None,
) -> tuple[dict[str, list], dict[str, int]]:
    """Feature columns (FEATURES) of a split with columns tokens, ner_tags, document, and
    counts: sentences, features, split_sentences (cut into several targets), cut_words (a
    word longer than a whole sequence, cut to its first pieces), empty_words (no pieces)."""
    if max_seq_length < 3:
        raise BertkitError(f"task.max_seq_length={max_seq_length}: expected at least 3 "
                           f"([CLS], one word piece, [SEP])")
    room = max_seq_length - 2
    tokens = sentences["tokens"][:]
    tags = sentences["ner_tags"][:]
    documents = sentences["document"][:]
    if label_all_subtokens and continuation is None:
        raise BertkitError("label_all_subtokens needs the continuation label of every label")
    if document_context and NO_DOCUMENT in documents:
        raise BertkitError(
            "task.document_context=true needs the document of every sentence, and this data "
            "has none (Hub copies of CoNLL-2003 drop the -DOCSTART- lines): give the files in "
            "the CoNLL format (task.data_dir or task.*_file), or task.hub.columns.document")
    pieces = word_pieces(tokens, tokenizer)
    counts = {"sentences": len(tokens), "features": 0, "split_sentences": 0, "cut_words": 0,
              "empty_words": 0}
    for words in pieces:
        for i, word in enumerate(words):
            if len(word) > room:
                words[i] = word[:room]
                counts["cut_words"] += 1
            counts["empty_words"] += not word

    # The unit context is drawn from: the document (consecutive sentences with the same
    # document id), or the sentence alone.
    units: list[list[int]] = []
    for s, document in enumerate(documents):
        if document_context and units and documents[units[-1][-1]] == document:
            units[-1].append(s)
        else:
            units.append([s])

    out: dict[str, list] = {name: [] for name in FEATURES}
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for unit in units:
        flat = [word for s in unit for word in pieces[s]]  # the unit's words, in order
        lengths = [len(word) for word in flat]
        offset = 0
        for s in unit:
            n_words = len(pieces[s])
            chunks = _chunks(lengths[offset:offset + n_words], room)
            counts["split_sentences"] += len(chunks) > 1
            for a, b in chunks:
                start, stop = offset + a, offset + b
                target = sum(lengths[start:stop])
                left, right = _context(lengths, start, stop, room - target)
                ids, labels, positions = [cls], [IGNORED], []
                for w in range(left, right):
                    word = flat[w]
                    if start <= w < stop:
                        tag = tags[s][w - offset]
                        positions.append(len(ids) if word else -1)
                        rest = continuation[tag] if label_all_subtokens else IGNORED
                        labels.extend([tag] + [rest] * (len(word) - 1) if word else [])
                    else:
                        labels.extend([IGNORED] * len(word))
                    ids.extend(word)
                ids.append(sep)
                labels.append(IGNORED)
                out["input_ids"].append(ids)
                out["token_type_ids"].append([0] * len(ids))
                out["attention_mask"].append([1] * len(ids))
                out["labels"].append(labels)
                out["length"].append(len(ids))
                out["sentence"].append(s)
                out["word_positions"].append(positions)
                out["word_labels"].append(tags[s][a:b])
            offset += n_words
    counts["features"] = len(out["input_ids"])
    return out, counts


def word_predictions(features: datasets.Dataset, token_predictions: np.ndarray,
                     outside: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(gold, predicted) label ids per sentence and word, from the prediction of every
    feature's tokens (rows in feature order): each word's first sub-token, `outside` (the id
    of O) for a word without sub-tokens. Every sentence has a feature: they number
    max(sentence) + 1."""
    sentences = features["sentence"][:]
    n_sentences = max(sentences, default=-1) + 1
    gold: list[list[int]] = [[] for _ in range(n_sentences)]
    predicted: list[list[int]] = [[] for _ in range(n_sentences)]
    columns = zip(sentences, features["word_positions"][:],
                  features["word_labels"][:], strict=True)
    for row, (sentence, positions, labels) in enumerate(columns):
        gold[sentence].extend(labels)
        at = np.asarray(positions, dtype=np.int64)
        values = token_predictions[row, np.maximum(at, 0)] if len(at) else at
        predicted[sentence].extend(np.where(at >= 0, values, outside).tolist())
    return gold, predicted


def feature_splits(
    splits: dict[str, datasets.Dataset],
    tokenizer: PreTrainedTokenizerBase,
    *,
    labels: Sequence[str],
    max_seq_length: int,
    label_all_subtokens: bool,
    document_context: bool,
    cache_dir: str | Path,
) -> tuple[dict[str, datasets.Dataset], dict[str, dict[str, int]]]:
    """Features of every split and their counts, cached under cache_dir by the split's
    bertkit_fingerprint (bertkit.tasks.ner.data), the tokenizer and the settings: every run and
    sweep job that reads the same data builds them once."""
    from bertkit.tasks.glue.features import tokenizer_fingerprint

    continuation = continuation_labels(labels)
    settings = {"max_seq_length": max_seq_length, "label_all_subtokens": label_all_subtokens,
                "document_context": document_context, "labels": list(labels), "version": 1}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    cache = Path(cache_dir) / "ner_features"
    cache.mkdir(parents=True, exist_ok=True)
    features, counts = {}, {}
    for split, sentences in splits.items():
        name = f"{sentences.bertkit_fingerprint}-{tokenizer_fingerprint(tokenizer)}-{key}"
        directory = cache / name
        counts_file = directory / "counts.json"
        if not counts_file.is_file():
            columns, split_counts = build_features(
                sentences, tokenizer, max_seq_length=max_seq_length,
                label_all_subtokens=label_all_subtokens, document_context=document_context,
                continuation=continuation)
            _save_atomic(datasets.Dataset.from_dict(columns, features=FEATURES), split_counts,
                         directory)
        counts[split] = json.loads(counts_file.read_text())
        features[split] = datasets.load_from_disk(str(directory / "features"))
        if counts[split]["split_sentences"] or counts[split]["cut_words"]:
            logger.warning(
                "%s: %d sentences longer than task.max_seq_length=%d are cut into several "
                "targets (each sees the rest as context), %d words longer than a sequence "
                "are cut to their first pieces", split, counts[split]["split_sentences"],
                max_seq_length, counts[split]["cut_words"])
    return features, counts


def _save_atomic(table: datasets.Dataset, counts: dict, directory: Path) -> None:
    """Written to a temporary directory and renamed, so a crash never leaves half a cache."""
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        table.save_to_disk(str(tmp / "features"))
        (tmp / "counts.json").write_text(json.dumps(counts))
        try:
            os.replace(tmp, directory)
        except OSError:  # another process got there first: its copy is the same
            if not (directory / "counts.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)

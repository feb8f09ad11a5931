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
tokenizer and settings (bertkit.data.cache).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from bertkit.data.cache import cache_entry, cached_build
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError
from bertkit.tasks.ner.files import NO_DOCUMENT

logger = logging.getLogger(__name__)

IGNORED = -100
# sentence: row of the split; word_positions: token position of each target word's first
# sub-token (-1 for a word with no sub-token); word_labels: the target words' gold label ids.
DECODING_COLUMNS = ("sentence", "word_positions", "word_labels")
# Counts of a split, carried per feature while it is built (bertkit.tasks.ner.features).
COUNTED = ("split_sentences", "cut_words", "empty_words")
_IDS = datasets.List(datasets.Value("int64"))
FEATURES = datasets.Features({
    "input_ids": _IDS, "token_type_ids": _IDS, "attention_mask": _IDS, "labels": _IDS,
    "length": datasets.Value("int64"), "sentence": datasets.Value("int64"),
    "word_positions": _IDS, "word_labels": _IDS,
})
# What the map builds: the features and each one's share of the counts.
_BUILT = datasets.Features({**FEATURES, **dict.fromkeys(COUNTED, datasets.Value("int64"))})
# A unit (bertkit.tasks.ner.features._units): its sentences' rows, words and tag ids.
_UNIT = datasets.Features({"rows": _IDS,
                           "tokens": datasets.List(datasets.List(datasets.Value("string"))),
                           "tags": datasets.List(datasets.List(datasets.Value("int64")))})


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


def _check_fast(tokenizer: PreTrainedTokenizerBase) -> None:
    if not tokenizer.is_fast:
        raise BertkitError("NER features need a fast tokenizer (word ids): give model.tokenizer "
                           "a directory with vocab.txt or tokenizer.json")


def word_pieces(sentences: Sequence[Sequence[str]],
                tokenizer: PreTrainedTokenizerBase) -> list[list[list[int]]]:
    """Per sentence, per word, its WordPiece ids (an empty list for a word the tokenizer
    drops, e.g. a lone control character)."""
    _check_fast(tokenizer)
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


def _units(sentences: datasets.Dataset, document_context: bool) -> datasets.Dataset:
    """One row per unit context is drawn from (a document's consecutive sentences with
    task.document_context, else each sentence alone): its sentences' rows, words and tags.
    The map over it needs nothing else, so workers get their own units only and datasets
    hashes no closure over the whole split."""
    documents = sentences["document"][:]
    units: list[list[int]] = []
    for s, document in enumerate(documents):
        if document_context and units and documents[units[-1][-1]] == document:
            units[-1].append(s)
        else:
            units.append([s])
    tokens, tags = sentences["tokens"][:], sentences["ner_tags"][:]
    return datasets.Dataset.from_dict(
        {"rows": units, "tokens": [[tokens[s] for s in unit] for unit in units],
         "tags": [[tags[s] for s in unit] for unit in units]}, features=_UNIT)


def _unit_features(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, room: int,
                   label_all_subtokens: bool, continuation) -> dict[str, list]:
    """Feature columns of whole units; per feature also its share of the counts (each
    sentence's counts ride on its first feature), summed by build_features."""
    flat_pieces = iter(word_pieces([words for unit in batch["tokens"] for words in unit],
                                   tokenizer))
    out: dict[str, list] = {name: [] for name in (*FEATURES, *COUNTED)}
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for rows, unit_tags in zip(batch["rows"], batch["tags"], strict=True):
        pieces = [next(flat_pieces) for _ in rows]
        flat = [word[:room] for words in pieces for word in words]  # the unit's words, in order
        lengths = [len(word) for word in flat]
        offset = 0
        for s, words, tags in zip(rows, pieces, unit_tags, strict=True):
            chunks = _chunks(lengths[offset:offset + len(words)], room)
            for k, (a, b) in enumerate(chunks):
                start, stop = offset + a, offset + b
                left, right = _context(lengths, start, stop, room - sum(lengths[start:stop]))
                ids, labels, positions = [cls], [IGNORED], []
                for w in range(left, right):
                    word = flat[w]
                    if start <= w < stop:
                        tag = tags[w - offset]
                        positions.append(len(ids) if word else -1)
                        rest = continuation[tag] if label_all_subtokens else IGNORED
                        labels.extend([tag] + [rest] * (len(word) - 1) if word else [])
                    else:
                        labels.extend([IGNORED] * len(word))
                    ids.extend(word)
                ids.append(sep)
                labels.append(IGNORED)
                first = k == 0
                for name, value in (("input_ids", ids), ("token_type_ids", [0] * len(ids)),
                                    ("attention_mask", [1] * len(ids)), ("labels", labels),
                                    ("length", len(ids)), ("sentence", s),
                                    ("word_positions", positions), ("word_labels", tags[a:b]),
                                    ("split_sentences", int(first and len(chunks) > 1)),
                                    ("cut_words", sum(len(w) > room for w in words) * first),
                                    ("empty_words", sum(not w for w in words) * first)):
                    out[name].append(value)
            offset += len(words)
    return out


def build_features(
    sentences: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_seq_length: int,
    label_all_subtokens: bool = False,
    document_context: bool = False,
    continuation: Sequence[int] | None = None,
    num_proc: int = 1,
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Features (FEATURES) of a split with columns tokens, ner_tags, document, and counts:
    sentences, features, split_sentences (cut into several targets), cut_words (a word longer
    than a whole sequence, cut to its first pieces), empty_words (no pieces).

    Built by datasets.map over whole units (documents or sentences), so that num_proc
    processes give exactly the features of one: a unit never straddles two processes."""
    if label_all_subtokens and continuation is None:
        raise BertkitError("label_all_subtokens needs the continuation label of every label")
    if document_context and NO_DOCUMENT in sentences["document"][:]:
        raise BertkitError(
            "task.document_context=true needs the document of every sentence, and this data "
            "has none (Hub copies of CoNLL-2003 drop the -DOCSTART- lines): give the files in "
            "the CoNLL format (task.data_dir or task.*_file), or task.hub.columns.document")
    _check_fast(tokenizer)  # here, not in a worker process
    units = _units(sentences, document_context)
    if len(units):
        table = units.map(
            _unit_features, batched=True, remove_columns=units.column_names, features=_BUILT,
            fn_kwargs={"tokenizer": tokenizer, "room": max_seq_length - 2,
                       "label_all_subtokens": label_all_subtokens,
                       "continuation": continuation},
            num_proc=num_proc if num_proc > 1 and len(units) > 1 else None,
            keep_in_memory=True, desc="NER features")
    else:  # datasets.map hands an empty table back as it is
        table = datasets.Dataset.from_dict({name: [] for name in _BUILT}, features=_BUILT)
    counts = {"sentences": len(sentences), "features": len(table),
              **{name: int(sum(table[name][:])) for name in COUNTED}}
    return table.remove_columns(list(COUNTED)), counts


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
    splits: TaskSplits,
    tokenizer: PreTrainedTokenizerBase,
    *,
    labels: Sequence[str],
    max_seq_length: int,
    label_all_subtokens: bool,
    document_context: bool,
    cache_dir: str | Path,
    num_proc: int = 1,
) -> tuple[dict[str, datasets.Dataset], dict[str, dict[str, int]]]:
    """Features of every split and their counts, cached by the split's fingerprint, the
    tokenizer and the settings (bertkit.data.cache): every run and sweep job that reads the
    same data builds them once."""
    continuation = continuation_labels(labels)
    settings = {"max_seq_length": max_seq_length, "label_all_subtokens": label_all_subtokens,
                "document_context": document_context, "labels": list(labels), "version": 2}
    features, counts = {}, {}
    for split, sentences in splits.items():
        entry = cache_entry(cache_dir, "ner", data=splits.fingerprints[split],
                            tokenizer=tokenizer, settings=settings)
        build = functools.partial(
            build_features, sentences, tokenizer, max_seq_length=max_seq_length,
            label_all_subtokens=label_all_subtokens, document_context=document_context,
            continuation=continuation, num_proc=num_proc)
        features[split], counts[split] = cached_build(entry, "features", build)
        if counts[split]["split_sentences"] or counts[split]["cut_words"]:
            logger.warning(
                "%s: %d sentences longer than task.max_seq_length=%d are cut into several "
                "targets (each sees the rest as context), %d words longer than a sequence "
                "are cut to their first pieces", split, counts[split]["split_sentences"],
                max_seq_length, counts[split]["cut_words"])
    return features, counts

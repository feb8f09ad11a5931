"""SQuAD examples -> model windows: [CLS] question [SEP] passage window [SEP].

A passage longer than one window is cut into overlapping windows by the fast tokenizer
(return_overflowing_tokens, stride), as Hugging Face's run_qa.py does, with Google's
run_squad.py settings on top:

- max_query_length: the question keeps its first max_query_length WordPiece tokens. The
  tokenizer cannot truncate the first sequence while it windows the second, so the question
  text is cut at the character end of its last kept token before the pair is tokenised.
- doc_stride is Google's: the step, in passage tokens, between the starts of consecutive
  windows (not HF's `stride`, the overlap). The room for the passage depends on the question's
  length, so examples are tokenised in groups of equal question length, each with HF overlap
  = (max_seq_length - 3 - question tokens) - doc_stride. The windows are then Google's exactly.

No padding here: the collator pads each batch. A run's windows are cached on disk
(bertkit.data.cache, kind "squad"), one entry per split, keyed by the split's data, the
tokenizer and the window settings.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from bertkit.data.cache import cache_entry, cached_map
from bertkit.data.task_data import TaskSplits
from bertkit.errors import BertkitError

# length: the window's token count, for batches grouped by length (BertkitTrainer).
TRAIN_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "start_positions",
                 "end_positions", "length")
EVAL_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "example_id", "offset_mapping",
                "token_is_max_context")
DECODING_COLUMNS = ("example_id", "offset_mapping", "token_is_max_context")  # not model inputs
_IDS = datasets.List(datasets.Value("int64"))
TRAIN_FEATURES = datasets.Features({
    "input_ids": _IDS, "token_type_ids": _IDS, "attention_mask": _IDS,
    "start_positions": datasets.Value("int64"), "end_positions": datasets.Value("int64"),
    "length": datasets.Value("int64"),
})
EVAL_FEATURES = datasets.Features({
    "input_ids": _IDS, "token_type_ids": _IDS, "attention_mask": _IDS,
    "example_id": datasets.Value("string"),
    # None outside the passage ([CLS], question, [SEP]): decoding never picks those tokens.
    "offset_mapping": datasets.List(datasets.List(datasets.Value("int64"))),
    # Google's token_is_max_context: the one window where this passage token may start a span.
    "token_is_max_context": datasets.List(datasets.Value("bool")),
})


def check_window_settings(max_seq_length: int, doc_stride: int, max_query_length: int) -> int:
    """The passage room left by the longest question; raises unless windows can overlap.

    Checked on the settings alone (as Google's run_squad.py does), not per example, so that a
    configuration fails the same way on every data set. Each value's own range is the
    schema's (TaskSchema); this is the rule between them."""
    room = max_seq_length - max_query_length - 3
    if room <= 0:
        raise BertkitError(
            f"task.max_seq_length={max_seq_length} leaves no room for the passage after a "
            f"question of task.max_query_length={max_query_length} tokens, [CLS] and two [SEP]: "
            f"raise task.max_seq_length above {max_query_length + 3} or lower "
            f"task.max_query_length"
        )
    if doc_stride >= room:
        raise BertkitError(
            f"task.doc_stride={doc_stride} (the step between window starts) must be smaller "
            f"than the passage room of a window, {room} tokens (task.max_seq_length="
            f"{max_seq_length} - task.max_query_length={max_query_length} - 3), so that "
            f"consecutive windows overlap and every answer fits in one"
        )
    return room


def truncate_questions(questions: list[str], tokenizer: PreTrainedTokenizerBase,
                       max_query_length: int) -> tuple[list[str], list[int]]:
    """Each question cut to its first max_query_length tokens, and its token count.

    The cut is at the end character of the last kept token; WordPiece re-tokenises such a
    prefix to the same tokens, and the count is checked (cut one token earlier if not)."""
    encoded = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    out = list(questions)
    lengths = [min(len(offsets), max_query_length) for offsets in encoded["offset_mapping"]]
    pending = [(i, offsets) for i, offsets in enumerate(encoded["offset_mapping"])
               if len(offsets) > max_query_length]
    keep = max_query_length
    while pending and keep > 0:
        texts = [questions[i][:offsets[keep - 1][1]] for i, offsets in pending]
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        left = []
        for (i, offsets), text, count in zip(pending, texts, counts, strict=True):
            out[i], lengths[i] = text, count
            if count > max_query_length:
                left.append((i, offsets))
        pending, keep = left, keep - 1
    return out, lengths


def max_context_flags(window_starts: list[int], window_lengths: list[int]) -> list[np.ndarray]:
    """Per window, which of its passage tokens have their most context in that window.

    Google's _check_is_max_context: score = min(left, right context) + 0.01 * window length;
    the first window with the highest score wins a tie."""
    if len(window_starts) == 1:
        return [np.ones(window_lengths[0], dtype=bool)]
    starts = np.asarray(window_starts)[:, None]
    lengths = np.asarray(window_lengths)[:, None]
    position = np.arange(int((starts + lengths).max()))[None, :]
    inside = (position >= starts) & (position < starts + lengths)
    score = np.minimum(position - starts, starts + lengths - 1 - position) + 0.01 * lengths
    best = np.where(inside, score, -np.inf).argmax(axis=0)
    return [best[start:start + length] == w
            for w, (start, length) in enumerate(zip(window_starts, window_lengths, strict=True))]


def _windows(batch: dict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
             doc_stride: int, max_query_length: int) -> list[list[tuple[int, int, object]]]:
    """Per example, its windows as (passage start token, passage length, tokenizers
    Encoding), in passage order."""
    questions, lengths = truncate_questions(list(batch["question"]), tokenizer, max_query_length)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, length in enumerate(lengths):
        groups[length].append(i)
    windows: list[list] = [[] for _ in questions]
    for length, indices in groups.items():
        encoded = tokenizer(
            [questions[i] for i in indices],
            [batch["context"][i] for i in indices],
            truncation="only_second",
            max_length=max_seq_length,
            stride=max_seq_length - 3 - length - doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        for encoding, sample in zip(encoded.encodings, encoded["overflow_to_sample_mapping"],
                                    strict=True):
            passage_length = sum(1 for s in encoding.sequence_ids if s == 1)
            example_windows = windows[indices[sample]]
            example_windows.append((len(example_windows) * doc_stride, passage_length, encoding))
    return windows


def _passage_span(encoding) -> tuple[int, int]:
    """[first, last + 1) token indices of the passage in a window (empty when it has none)."""
    sequence_ids = encoding.sequence_ids
    first = next((j for j, s in enumerate(sequence_ids) if s == 1), len(sequence_ids))
    return first, first + sum(1 for s in sequence_ids if s == 1)


def _answer_positions(encoding, answers: dict) -> tuple[int, int]:
    """Token positions of the first answer when this window holds all of it, else [CLS] (0).

    The span is the passage tokens overlapping the answer's characters (white space at its ends
    ignored), so an answer starting or ending inside a token takes the whole token."""
    if not answers["text"]:
        return 0, 0
    text, start_char = answers["text"][0], answers["answer_start"][0]
    stripped = text.lstrip()
    start_char += len(text) - len(stripped)
    end_char = start_char + len(stripped.rstrip())
    first, stop = _passage_span(encoding)
    offsets = encoding.offsets[first:stop]
    if end_char <= start_char or not offsets:
        return 0, 0
    if offsets[0][0] > start_char or offsets[-1][1] < end_char:
        return 0, 0
    start = bisect_right([end for _, end in offsets], start_char)
    end = bisect_left([begin for begin, _ in offsets], end_char) - 1
    if end < start:
        return 0, 0
    return first + start, first + end


def _map_windows(examples: datasets.Dataset, encode, features: datasets.Features, desc: str,
                 num_proc: int | None, entry: Path | None, name: str) -> datasets.Dataset:
    """examples.map(encode): one row per window, cached as <entry>/<name>.arrow when the run
    gives a cache entry (window_splits); in memory otherwise."""
    kwargs = dict(remove_columns=examples.column_names, features=features, desc=desc)
    if entry is None:
        return examples.map(encode, batched=True, num_proc=num_proc, **kwargs)
    return cached_map(examples, encode, entry, name, num_proc=num_proc or 1, **kwargs)


def train_features(examples: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                   max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                   num_proc: int | None = None, entry: Path | None = None) -> datasets.Dataset:
    """One row per window: input_ids, token_type_ids, attention_mask, start/end_positions.

    doc_stride is the step between window starts (Google's meaning, see the module docstring).
    start/end_positions point at the first answer's tokens in a window holding all of it, and
    at [CLS] (0, 0) in the other windows and for an unanswerable question."""
    check_window_settings(max_seq_length, doc_stride, max_query_length)

    def encode(batch: dict) -> dict:
        out = {key: [] for key in TRAIN_COLUMNS}
        for windows, answers in zip(_windows(batch, tokenizer, max_seq_length, doc_stride,
                                             max_query_length), batch["answers"], strict=True):
            for _, _, encoding in windows:
                out["input_ids"].append(encoding.ids)
                out["token_type_ids"].append(encoding.type_ids)
                out["attention_mask"].append(encoding.attention_mask)
                start, end = _answer_positions(encoding, answers)
                out["start_positions"].append(start)
                out["end_positions"].append(end)
                out["length"].append(len(encoding.ids))
        return out

    return _map_windows(examples, encode, TRAIN_FEATURES, "SQuAD training windows",
                        num_proc, entry, "train_windows")


def evaluation_features(examples: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *,
                        max_seq_length: int = 384, doc_stride: int = 128,
                        max_query_length: int = 64, num_proc: int | None = None,
                        entry: Path | None = None) -> datasets.Dataset:
    """One row per window, the same windows as train_features, with what decoding needs:
    example_id, offset_mapping (character span in the context per passage token, None
    elsewhere) and token_is_max_context. Drop those three before the model sees a batch."""
    check_window_settings(max_seq_length, doc_stride, max_query_length)

    def encode(batch: dict) -> dict:
        out = {key: [] for key in EVAL_COLUMNS}
        for windows, example_id in zip(_windows(batch, tokenizer, max_seq_length, doc_stride,
                                                max_query_length), batch["id"], strict=True):
            flags = max_context_flags([w[0] for w in windows], [w[1] for w in windows])
            for (_, _, encoding), window_flags in zip(windows, flags, strict=True):
                first, stop = _passage_span(encoding)
                size = len(encoding.ids)
                out["input_ids"].append(encoding.ids)
                out["token_type_ids"].append(encoding.type_ids)
                out["attention_mask"].append(encoding.attention_mask)
                out["example_id"].append(example_id)
                out["offset_mapping"].append(
                    [None] * first + [list(o) for o in encoding.offsets[first:stop]]
                    + [None] * (size - stop))
                out["token_is_max_context"].append(
                    [False] * first + window_flags.tolist() + [False] * (size - stop))
        return out

    return _map_windows(examples, encode, EVAL_FEATURES, "SQuAD evaluation windows",
                        num_proc, entry, "evaluation_windows")


def window_splits(splits: TaskSplits, tokenizer: PreTrainedTokenizerBase, *,
                  max_seq_length: int, doc_stride: int, max_query_length: int,
                  cache_dir: str | Path, num_proc: int = 1
                  ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(training windows of splits["train"], evaluation windows of splits["validation"]),
    cached on disk under cache_dir by split data, tokenizer and window settings: every run and
    sweep job that reads the same data tokenises it once."""
    if not tokenizer.is_fast:
        raise BertkitError("SQuAD windows need a fast tokenizer (offset mappings): give "
                           "model.tokenizer a directory with vocab.txt or tokenizer.json")
    check_window_settings(max_seq_length, doc_stride, max_query_length)
    settings = dict(max_seq_length=max_seq_length, doc_stride=doc_stride,
                    max_query_length=max_query_length)

    def entry(split: str) -> Path:
        return cache_entry(cache_dir, "squad", data=splits.fingerprint(split),
                           tokenizer=tokenizer, settings=settings)

    train = train_features(splits["train"], tokenizer, **settings, num_proc=num_proc,
                           entry=entry("train"))
    evaluation = evaluation_features(splits["validation"], tokenizer, **settings,
                                     num_proc=num_proc, entry=entry("validation"))
    return train, evaluation

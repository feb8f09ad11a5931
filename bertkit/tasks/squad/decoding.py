"""Start/end logits per window -> one answer text per SQuAD question (Google's run_squad.py
write_predictions, vectorised with numpy so a whole dev set decodes in about a second).

Per window, the n_best_size highest start and end logits among the tokens that may start or
end a span are paired in a k x k score matrix; a span is valid when both ends lie in the
passage, end >= start, it is at most max_answer_length tokens long, and its start token has
its most context in this window (token_is_max_context). One difference from Google: invalid
tokens are masked before the top-k choice, so question tokens with high logits cannot crowd
the valid ones out of the top k. The answer is the best valid span over all the question's
windows, cut from the context by character offsets, so it is the original text exactly.

SQuAD v2.0: the null score is the minimum over the windows of start_logit[CLS] +
end_logit[CLS]; the answer is "" when null - best span score > null_score_diff_threshold,
and null_odds = null - best span score (evaluate-v2.0.py's na_prob: higher = more likely
unanswerable). A question with no valid span at all (only with an empty passage) gets ""
(Google writes "empty"), and in v2.0 null odds of +inf.
"""

from __future__ import annotations

from typing import NamedTuple

import datasets
import numpy as np
import pyarrow as pa

from bertkit.errors import BertkitError


class SquadPredictions(NamedTuple):
    predictions: dict[str, str]
    null_odds: dict[str, float] | None  # v2.0 only
    nbest: dict[str, list[dict]] | None  # with_nbest only
    # v2.0 scoring: the best non-null span of every question, before the null threshold.
    spans: dict[str, str] | None = None


class _Windows(NamedTuple):
    example: np.ndarray  # (n,) index of each window's example
    start: np.ndarray  # (n,) offset of each window's first token in the flat token arrays
    can_start: np.ndarray  # (n, width) bool
    can_end: np.ndarray  # (n, width) bool
    char_start: np.ndarray  # (tokens,) character offsets in the context, flat over windows
    char_end: np.ndarray


def _flat(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _windows(features: datasets.Dataset, example_index: dict[str, int], width: int) -> _Windows:
    """Per-window masks and per-token offsets, read column-wise from Arrow (no row loop)."""
    missing = {"example_id", "offset_mapping"} - set(features.column_names)
    if missing:
        raise BertkitError(f"SQuAD features lack the column(s) {', '.join(sorted(missing))}: "
                           f"build them with bertkit.tasks.squad.features.evaluation_features")
    has_max_context = "token_is_max_context" in features.column_names
    columns = ["example_id", "offset_mapping"] + (["token_is_max_context"] * has_max_context)
    table = features.select_columns(columns).with_format("arrow")[:]
    offsets = _flat(table.column("offset_mapping"))
    lengths = offsets.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    tokens = offsets.flatten()  # one [start, end] list per token, null outside the passage
    passage = tokens.is_valid().to_numpy(zero_copy_only=False)
    pairs = tokens.flatten().to_numpy(zero_copy_only=False).reshape(-1, 2)
    char_start = np.zeros(len(tokens), dtype=np.int64)
    char_end = np.zeros(len(tokens), dtype=np.int64)
    char_start[passage], char_end[passage] = pairs[:, 0], pairs[:, 1]
    if has_max_context:
        max_context = _flat(table.column("token_is_max_context")).flatten()
        max_context = max_context.to_numpy(zero_copy_only=False)
    else:  # features without the column (run_qa.py style): every passage token may start
        max_context = np.ones(len(tokens), dtype=bool)
    if lengths.size and lengths.max() > width:
        raise BertkitError(f"SQuAD logits are {width} positions wide but a window has "
                           f"{lengths.max()} tokens: were they computed on these features?")

    ids = table.column("example_id").to_pylist()
    unknown = next((qid for qid in ids if qid not in example_index), None)
    if unknown is not None:
        raise BertkitError(f"SQuAD features: example_id {unknown!r} is not among the examples")
    example = np.fromiter((example_index[qid] for qid in ids), dtype=np.int64, count=len(ids))
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.arange(len(tokens)) - np.repeat(start, lengths)
    can_end = np.zeros((len(lengths), width), dtype=bool)
    can_end[rows, cols] = passage
    can_start = np.zeros_like(can_end)
    can_start[rows, cols] = passage & max_context
    return _Windows(example, start, can_start, can_end, char_start, char_end)


def _top_k(logits: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k highest allowed positions (sorted by position: ties go to the earliest)
    and their logits as float64 (-inf where fewer than k are allowed)."""
    masked = np.where(allowed, logits, -np.inf)
    index = np.sort(np.argpartition(masked, masked.shape[1] - k, axis=1)[:, -k:], axis=1)
    return index, np.take_along_axis(masked, index, axis=1).astype(np.float64)


def _check_logits(start_logits, end_logits, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    if start_logits.ndim != 2 or start_logits.shape != end_logits.shape:
        raise BertkitError(f"SQuAD logits: expected start and end arrays of the same shape "
                           f"(windows, positions), got {start_logits.shape} and "
                           f"{end_logits.shape}")
    if start_logits.shape[0] != n_features:
        raise BertkitError(f"SQuAD logits have {start_logits.shape[0]} rows for "
                           f"{n_features} feature windows")
    return start_logits, end_logits


def decode_predictions(
    examples: datasets.Dataset,
    features: datasets.Dataset,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool,
    null_score_diff_threshold: float = 0.0,
    with_nbest: bool = False,
) -> SquadPredictions:
    """Answer texts by question id (and v2.0 null odds, and with_nbest the n best answers per
    question as Google's nbest_predictions.json: text, start_logit, end_logit, probability).

    features: evaluation_features of these examples, one logits row per window (padding to
    the right, e.g. the Trainer's -100, is ignored). n_best_size and max_answer_length are
    task.*'s, held to TaskSchema (>= 1) before a finetune starts."""
    start_logits, end_logits = _check_logits(start_logits, end_logits, len(features))
    table = examples.select_columns(["id", "context"]).with_format("arrow")[:]
    example_ids = table.column("id").to_pylist()
    contexts = table.column("context").to_pylist()
    example_index = {qid: i for i, qid in enumerate(example_ids)}
    if len(example_index) != len(example_ids):
        raise BertkitError("SQuAD examples: a question id appears twice")
    n, width = start_logits.shape
    windows = _windows(features, example_index, width)
    no_window = np.bincount(windows.example, minlength=len(example_ids)) == 0
    if no_window.any():
        raise BertkitError(f"SQuAD example {example_ids[int(no_window.argmax())]!r} has no "
                           f"feature window: build the features from the same examples")

    k = min(n_best_size, width)
    top_start, start_values = _top_k(start_logits, windows.can_start, k)
    top_end, end_values = _top_k(end_logits, windows.can_end, k)
    score = start_values[:, :, None] + end_values[:, None, :]  # (n, k, k)
    span = top_end[:, None, :] - top_start[:, :, None]
    score[(span < 0) | (span >= max_answer_length) | ~np.isfinite(score)] = -np.inf
    flat = score.reshape(n, k * k).argmax(axis=1)
    rows = np.arange(n)
    best = score.reshape(n, k * k)[rows, flat]
    best_start = windows.start + top_start[rows, flat // k]
    best_end = windows.start + top_end[rows, flat % k]

    # The best window per example: sort by (example, -score); a tie keeps window order.
    order = np.lexsort((-best, windows.example))
    leader = order[np.r_[True, windows.example[order][1:] != windows.example[order][:-1]]]
    predictions, best_of = {}, np.full(len(example_ids), -np.inf)
    for w in leader.tolist():
        e = int(windows.example[w])
        best_of[e] = best[w]
        text = ""
        if np.isfinite(best[w]):
            text = contexts[e][windows.char_start[best_start[w]]:windows.char_end[best_end[w]]]
        predictions[example_ids[e]] = text

    null_odds = None
    null_window = None
    if version_2:
        null = start_logits[:, 0].astype(np.float64) + end_logits[:, 0].astype(np.float64)
        null_order = np.lexsort((null, windows.example))
        null_window = null_order[np.r_[True, windows.example[null_order][1:]
                                       != windows.example[null_order][:-1]]]
        null_of = np.empty(len(example_ids))
        null_of[windows.example[null_window]] = null[null_window]
        diff = null_of - best_of  # +inf where no span is valid
        null_odds = {}
        for e, qid in enumerate(example_ids):
            null_odds[qid] = float(diff[e])
            if diff[e] > null_score_diff_threshold:
                predictions[qid] = ""
    nbest = None
    if with_nbest:
        nbest = _nbest(example_ids, contexts, windows, score, top_start, top_end, start_values,
                       end_values, n_best_size, start_logits, end_logits, null_window)
    return SquadPredictions(predictions, null_odds, nbest)


def _nbest(example_ids, contexts, windows, score, top_start, top_end, start_values, end_values,
           n_best_size, start_logits, end_logits, null_window) -> dict[str, list[dict]]:
    """Per question, its n_best_size best distinct answer texts over all windows (and in
    v2.0 the null answer "" of its minimum-null window), with softmax probabilities."""
    w, a, b = np.nonzero(np.isfinite(score))
    values = score[w, a, b]
    order = np.lexsort((-values, windows.example[w]))
    w, a, b = w[order], a[order], b[order]
    bounds = np.searchsorted(windows.example[w], np.arange(len(example_ids) + 1))
    nulls = {}
    if null_window is not None:
        for window in null_window.tolist():
            nulls[int(windows.example[window])] = (float(start_logits[window, 0]),
                                                   float(end_logits[window, 0]))
    nbest = {}
    for e, qid in enumerate(example_ids):
        entries, seen = [], set()
        for i in range(bounds[e], bounds[e + 1]):
            first = windows.start[w[i]]
            text = contexts[e][windows.char_start[first + top_start[w[i], a[i]]]:
                               windows.char_end[first + top_end[w[i], b[i]]]]
            if text in seen:
                continue
            seen.add(text)
            entries.append({"text": text, "start_logit": float(start_values[w[i], a[i]]),
                            "end_logit": float(end_values[w[i], b[i]])})
            if len(entries) == n_best_size:
                break
        if e in nulls:
            entries.append({"text": "", "start_logit": nulls[e][0], "end_logit": nulls[e][1]})
            entries.sort(key=lambda entry: -(entry["start_logit"] + entry["end_logit"]))
        if entries:
            totals = np.array([entry["start_logit"] + entry["end_logit"] for entry in entries])
            probabilities = np.exp(totals - totals.max())
            probabilities /= probabilities.sum()
            for entry, probability in zip(entries, probabilities.tolist(), strict=True):
                entry["probability"] = probability
        nbest[qid] = entries
    return nbest

"""masking.convention: google (create_pretraining_data.py's count, candidates and random
replacements) and non_special (bertkit's rule before issue 51), each against a re-derivation
written here: the count of short sequences and at the .5 roundings, [UNK] masked or not,
[CLS]/[SEP]/padding never, the replacement distribution, and most_predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from bertkit.pretraining.batches import per_position_labels
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    DynamicMaskingCollator,
    Vocabulary,
    mask_sequence,
    most_predictions,
    prediction_budget,
    replace_chosen,
)
from tests.conftest import compose_config
from tests.pretraining.test_mlm_masking import SPECIALS, WORDS, rule, tokenizer  # noqa: F401

CONVENTIONS = ("google", "non_special")


def google_num_to_predict(tokens: list[str], p: float, most: int) -> int:
    """What Google's create_masked_lm_predictions predicts for one-token units, on token
    strings: its candidates are every token but [CLS] and [SEP], its count
    min(most, max(1, int(round(len(tokens) * p)))) (Python 3's round), cut short only when the
    candidates run out."""
    candidates = [t for t in tokens if t not in ("[CLS]", "[SEP]")]
    return min(most, max(1, int(round(len(tokens) * p))), len(candidates))


def non_special_count(tokens: list[str], p: float, most: int) -> int:
    """bertkit's earlier rule: 15% of the tokens that are not special, none without any."""
    n = sum(t not in SPECIALS for t in tokens)
    return 0 if n == 0 else min(most, max(1, int(round(n * p))))


EXPECTED = {"google": google_num_to_predict, "non_special": non_special_count}


def shaped(length: int, unk_every: int = 0, pair: bool = False) -> list[str]:
    """A sequence of `length` tokens: [CLS] words [SEP] (or [CLS] A [SEP] B [SEP]), with
    [UNK] at every unk_every-th body token; length 1 is [CLS] alone."""
    if length == 1:
        return ["[CLS]"]
    body = [WORDS[i % len(WORDS)] for i in range(length - (3 if pair else 2))]
    if unk_every:
        body = ["[UNK]" if i % unk_every == 0 else t for i, t in enumerate(body)]
    if pair:
        cut = len(body) // 2
        return ["[CLS]", *body[:cut], "[SEP]", *body[cut:], "[SEP]"]
    return ["[CLS]", *body, "[SEP]"]


def shapes() -> list[list[str]]:
    short = [shaped(n) for n in range(1, 11)]
    short += [shaped(n, unk_every=2) for n in range(3, 11)]
    short += [shaped(n, pair=True) for n in range(5, 11)]
    # 10, 30, 50, 70, 90, 110 tokens: len * 0.15 ends in .5 (round half-to-even: 2, 4, 8, 10,
    # 14, 16), and so does the non-special count of the 32- and 52-token pairs (30, 50).
    halves = [shaped(n) for n in (10, 30, 50, 70, 90, 110)]
    halves += [shaped(n, pair=True) for n in (33, 53)] + [shaped(n, unk_every=3) for n in (30, 50)]
    return short + halves


def masked_counts(tokenizer, sequences, convention: str, path: str, most: int):  # noqa: F811
    vocab = Vocabulary.from_tokenizer(tokenizer)
    the_rule = rule(convention=convention, max_predictions_per_seq=most,
                    unit="whole_word" if path == "whole_word" else "token")
    ids = [np.array(tokenizer.convert_tokens_to_ids(tokens)) for tokens in sequences]
    if path == "collator":
        batch = DynamicMaskingCollator(tokenizer, the_rule)([{"input_ids": i.tolist()}
                                                            for i in ids])
        labels = per_position_labels(batch)
        assert (labels[batch["attention_mask"] == 0] == IGNORE_INDEX).all()
        return [int(n) for n in (labels != IGNORE_INDEX).sum(1)]
    rng = np.random.default_rng(0)
    return [int((mask_sequence(i, vocab, the_rule, rng)[1] != IGNORE_INDEX).sum()) for i in ids]


def test_the_re_derivation_rounds_as_google_does():
    """The .5 cases by hand: Python's round is half-to-even."""
    assert [google_num_to_predict(shaped(n), 0.15, 20) for n in (10, 30, 50, 70, 90, 110)] \
        == [2, 4, 8, 10, 14, 16]
    assert [google_num_to_predict(shaped(n), 0.15, 20) for n in (1, 2, 3, 7, 9)] == [0, 0, 1, 1, 1]
    assert non_special_count(shaped(33, pair=True), 0.15, 20) == 4  # 30 words: 4.5 -> 4


@pytest.mark.parametrize("path", ["mask_sequence", "whole_word", "collator"])
@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("most", [20, 3])
def test_count_per_sequence_is_the_conventions(tokenizer, convention, path, most):  # noqa: F811
    sequences = shapes()
    expected = [EXPECTED[convention](tokens, 0.15, most) for tokens in sequences]
    assert masked_counts(tokenizer, sequences, convention, path, most) == expected
    if convention == "google":  # the two rules differ on these sequences
        other = [non_special_count(tokens, 0.15, most) for tokens in sequences]
        assert other != expected


@pytest.mark.parametrize("path", ["mask_sequence", "collator"])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_unk_is_masked_under_google_only_and_frames_never(tokenizer, convention, path):  # noqa: F811
    """[UNK] (and a literal [MASK]) are candidates like any token under google, as often as
    their share of the candidates; never under non_special. [CLS], [SEP] and padding never."""
    rng = np.random.default_rng(5)
    word_ids = tokenizer.convert_tokens_to_ids(WORDS)
    unk, literal_mask = tokenizer.unk_token_id, tokenizer.mask_token_id
    rows = []
    for _ in range(2000):
        body = rng.choice(word_ids, size=int(rng.integers(10, 60))).tolist()
        for position in np.flatnonzero(rng.random(len(body)) < 0.2):
            body[position] = unk
        body[int(rng.integers(len(body)))] = literal_mask
        cut = len(body) // 2
        rows.append([tokenizer.cls_token_id, *body[:cut], tokenizer.sep_token_id, *body[cut:],
                     tokenizer.sep_token_id])
    vocab = Vocabulary.from_tokenizer(tokenizer)
    the_rule = rule(convention=convention, max_predictions_per_seq=20)
    chosen_ids, candidate_unks, candidates = [], 0, 0
    torch.manual_seed(0)
    collate = DynamicMaskingCollator(tokenizer, the_rule)
    for start in range(0, len(rows), 50):
        chunk = rows[start:start + 50]
        if path == "collator":
            batch = collate([{"input_ids": r} for r in chunk])
            labels = per_position_labels(batch).numpy()
        else:
            labels = np.full((len(chunk), max(map(len, chunk))), IGNORE_INDEX)
            for i, r in enumerate(chunk):
                labels[i, :len(r)] = mask_sequence(r, vocab, the_rule, rng)[1]
        for r, row_labels in zip(chunk, labels, strict=True):
            assert (row_labels[len(r):] == IGNORE_INDEX).all()  # never padding
            chosen = row_labels[row_labels != IGNORE_INDEX]
            chosen_ids.extend(chosen.tolist())
            candidate_unks += r.count(unk)
            candidates += len(r) - 3
    chosen_ids = np.array(chosen_ids)
    assert not np.isin(chosen_ids, [tokenizer.cls_token_id, tokenizer.sep_token_id,
                                    tokenizer.pad_token_id]).any()
    unk_share = (chosen_ids == unk).mean()
    if convention == "google":
        assert unk_share == pytest.approx(candidate_unks / candidates, abs=0.01)
        assert (chosen_ids == literal_mask).sum() > 50
    else:
        assert unk_share == 0 and not (chosen_ids == literal_mask).any()


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_random_replacements_are_uniform_over_the_conventions_pool(tokenizer, convention):  # noqa: F811
    """Every chosen position replaced by a random token: uniform over the whole vocabulary
    (specials included, as Google draws vocab_words[randint]) under google, over the
    non-special ids under non_special."""
    vocab = Vocabulary.from_tokenizer(tokenizer)
    ids = np.full((400, 400), tokenizer.convert_tokens_to_ids("w0"))
    replaced = replace_chosen(ids, np.ones(ids.shape, dtype=bool), vocab, 0.0, 1.0,
                              np.random.default_rng(7), convention)
    counts = np.bincount(replaced.ravel(), minlength=len(tokenizer))
    specials = tokenizer.all_special_ids
    pool = np.arange(len(tokenizer)) if convention == "google" \
        else np.setdiff1d(np.arange(len(tokenizer)), specials)
    assert counts.sum() == counts[pool].sum()
    assert (counts[pool] > 0).all()
    assert stats.chisquare(counts[pool]).pvalue > 1e-3
    special_share = counts[specials].sum() / counts.sum()
    expected = len(specials) / len(tokenizer) if convention == "google" else 0.0
    assert special_share == pytest.approx(expected, abs=0.003)


@pytest.mark.parametrize("most", [20, 80])
def test_most_predictions_is_googles_count_and_bounds_non_special(tokenizer, most):  # noqa: F811
    lengths = np.arange(1, 600)
    google = rule(max_predictions_per_seq=most)
    expected = [min(most, max(1, int(round(n * 0.15)))) for n in lengths]
    assert most_predictions(lengths, google).tolist() == expected
    assert [int(most_predictions(int(n), google)) for n in lengths[:20]] == expected[:20]
    # Google's own count, on sequences [CLS] words [SEP] of each length from 3 on.
    assert [google_num_to_predict(shaped(n), 0.15, most) for n in lengths[2:]] == expected[2:]
    non_special = rule(max_predictions_per_seq=most, convention="non_special")
    for n in lengths[2:]:
        for tokens in (shaped(int(n)), shaped(int(n), pair=n >= 5), shaped(int(n), unk_every=2)):
            assert non_special_count(tokens, 0.15, most) <= most_predictions(n, non_special)
    assert (prediction_budget(lengths, 0.15, most) == most_predictions(lengths, google)).all()


def test_the_default_is_google_in_both_masking_nodes():
    cfg = compose_config(["recipe=pretrain"])
    assert cfg.masking.convention == "google"
    assert cfg.heldout.masking.convention == "google"
    cfg = compose_config(["recipe=pretrain", "masking=dynamic"])
    assert cfg.masking.convention == "google"

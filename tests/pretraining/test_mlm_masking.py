"""Masking statistics over many sequences, whole-word and span units, and static vs dynamic
masks across epochs."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.pretraining.batches import per_position_labels
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    DynamicMaskingCollator,
    MaskingRule,
    Vocabulary,
    mask_sequence,
    padding_collator,
    static_masked_copies,
)
from tests.conftest import compose_config

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(100)]
PIECES = [f"##p{i}" for i in range(50)]
LENGTH = 128


def rule(**changes) -> MaskingRule:
    values = dict(mlm_probability=0.15, mask_token_fraction=0.8, random_token_fraction=0.1,
                  max_predictions_per_seq=LENGTH, unit="token", span_geometric_p=0.2,
                  span_max_words=10, convention="google")
    return MaskingRule(**{**values, **changes})


def excluded_ids(tokenizer, convention: str) -> set[int]:
    """Ids never chosen: Google's code skips only [CLS] and [SEP] (bertkit's padding too);
    non_special skips every special token."""
    if convention == "google":
        return {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    return set(tokenizer.all_special_ids)


def expected_count(ids, tokenizer, convention: str, most: int = LENGTH, p: float = 0.15) -> int:
    """Re-derived: google counts the sequence's tokens with [CLS] and [SEP]
    (create_masked_lm_predictions' num_to_predict, int(round(len(tokens) * p))), non_special
    its non-special tokens; Python's round (half-to-even); never more than the candidates."""
    real = [int(i) for i in ids if i != tokenizer.pad_token_id]
    candidates = [i for i in real if i not in excluded_ids(tokenizer, convention)]
    counted = len(real) if convention == "google" else len(candidates)
    if not candidates:
        return 0
    return min(most, max(1, int(round(counted * p))), len(candidates))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wordpiece")
    (directory / "vocab.txt").write_text("\n".join(SPECIALS + WORDS + PIECES) + "\n")
    return BertTokenizerFast.from_pretrained(str(directory))


def sequences(tokenizer, count: int, seed: int = 0, pieces: bool = False) -> list[np.ndarray]:
    """[CLS] A [SEP] B [SEP] then padding to LENGTH; words may carry ## continuations."""
    rng = np.random.default_rng(seed)
    word_ids = tokenizer.convert_tokens_to_ids(WORDS)
    piece_ids = tokenizer.convert_tokens_to_ids(PIECES)
    out = []
    for _ in range(count):
        body = []
        for _ in range(rng.integers(20, 60)):
            body.append(int(rng.choice(word_ids)))
            while pieces and rng.random() < 0.4:
                body.append(int(rng.choice(piece_ids)))
        body = body[:LENGTH - 3 - int(rng.integers(0, 30))]
        cut = len(body) // 2
        ids = [tokenizer.cls_token_id, *body[:cut], tokenizer.sep_token_id, *body[cut:],
               tokenizer.sep_token_id]
        out.append(np.array(ids + [tokenizer.pad_token_id] * (LENGTH - len(ids))))
    return out


def word_spans(ids: np.ndarray, vocab: Vocabulary) -> list[list[int]]:
    spans: list[list[int]] = []
    for position, token in enumerate(ids):
        if vocab.special[token]:
            continue
        if vocab.continuation[token] and spans and spans[-1][-1] == position - 1:
            spans[-1].append(position)
        else:
            spans.append([position])
    return spans


@pytest.mark.parametrize("convention", ["google", "non_special"])
def test_token_masking_statistics(tokenizer, convention):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rng = np.random.default_rng(1)
    excluded = np.isin(np.arange(len(tokenizer)), list(excluded_ids(tokenizer, convention)))
    # Random replacements: the whole vocabulary under google, the non-special ids otherwise.
    pool = len(tokenizer) if convention == "google" else len(tokenizer) - len(SPECIALS)
    predicted = counted = as_mask = unchanged = 0
    for ids in sequences(tokenizer, 3000):
        masked, labels = mask_sequence(ids, vocab, rule(convention=convention), rng)
        never = excluded[ids]
        chosen = labels != IGNORE_INDEX
        # Exactly the convention's count per sequence, and never an excluded token or padding.
        assert chosen.sum() == expected_count(ids, tokenizer, convention)
        assert not (chosen & never).any()
        assert (masked[never] == ids[never]).all()
        assert (labels[chosen] == ids[chosen]).all()
        assert (masked[~chosen] == ids[~chosen]).all()
        if convention == "non_special":
            assert not vocab.special[masked[chosen & (masked != vocab.mask_id)]].any()
        predicted += chosen.sum()
        counted += int((ids != tokenizer.pad_token_id).sum()) if convention == "google" \
            else int((~vocab.special[ids]).sum())
        as_mask += (masked[chosen] == vocab.mask_id).sum()
        unchanged += (masked[chosen] == ids[chosen]).sum()
    assert predicted / counted == pytest.approx(0.15, abs=0.003)
    assert as_mask / predicted == pytest.approx(0.8, abs=0.01)
    # "Unchanged" also catches the 1-in-pool random draws that hit the original token.
    assert unchanged / predicted == pytest.approx(0.1 + 0.1 / pool, abs=0.01)
    random_share = 1 - (as_mask + unchanged) / predicted
    assert random_share == pytest.approx(0.1 - 0.1 / pool, abs=0.01)


def test_max_predictions_per_seq_caps_the_count(tokenizer):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rng = np.random.default_rng(2)
    for ids in sequences(tokenizer, 500):
        _, labels = mask_sequence(ids, vocab, rule(max_predictions_per_seq=5), rng)
        assert (labels != IGNORE_INDEX).sum() == expected_count(ids, tokenizer, "google", most=5)


def test_whole_word_masking_never_masks_part_of_a_word(tokenizer):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rng = np.random.default_rng(3)
    partial_words_seen = 0
    for ids in sequences(tokenizer, 1000, pieces=True):
        _, labels = mask_sequence(ids, vocab, rule(unit="whole_word"), rng)
        chosen = labels != IGNORE_INDEX
        assert 0 < chosen.sum() <= expected_count(ids, tokenizer, "google")
        for word in word_spans(ids, vocab):
            assert chosen[word].all() or not chosen[word].any()
        # The same data with token masking does split words: the test can tell them apart.
        _, token_labels = mask_sequence(ids, vocab, rule(), rng)
        token_chosen = token_labels != IGNORE_INDEX
        partial_words_seen += sum(0 < token_chosen[w].sum() < len(w)
                                  for w in word_spans(ids, vocab))
    assert partial_words_seen > 100


def test_span_masking_masks_contiguous_runs_of_whole_words(tokenizer):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rng = np.random.default_rng(4)
    run_lengths = {"span": [], "token": []}
    for ids in sequences(tokenizer, 1000, pieces=True):
        for unit in run_lengths:
            _, labels = mask_sequence(ids, vocab, rule(unit=unit), rng)
            chosen = labels != IGNORE_INDEX
            words = word_spans(ids, vocab)
            hit = [chosen[w].all() for w in words]
            if unit == "span":
                assert all(chosen[w].all() or not chosen[w].any() for w in words)
                assert 0 < chosen.sum() <= expected_count(ids, tokenizer, "google")
            run = 0
            for flag in hit + [False]:
                if flag:
                    run += 1
                elif run:
                    run_lengths[unit].append(run)
                    run = 0
    # Geometric(0.2) spans clipped at 10 words average about 3.6 words, but with a budget of
    # ~7 tokens a sequence here the long ones rarely fit (2.2 measured); random tokens ~1.1.
    assert np.mean(run_lengths["span"]) > 1.8
    assert np.mean(run_lengths["token"]) < 1.3


def test_static_masks_repeat_across_epochs_and_copies_differ(tokenizer):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    rows = sequences(tokenizer, 40, seed=5)
    dataset = datasets.Dataset.from_dict({
        "input_ids": [r[r != tokenizer.pad_token_id].tolist() for r in rows],
        "example": list(range(len(rows)))})
    static = static_masked_copies(dataset, vocab, rule(), dupe_factor=3, seed=11)
    assert len(static) == 3 * 40

    collate = padding_collator(tokenizer, None)
    loader = torch.utils.data.DataLoader(static.with_format(columns=["input_ids", "labels"]),
                                         batch_size=8, shuffle=True, collate_fn=collate)

    def epoch() -> dict:
        seen = {}
        for batch in loader:
            rows = zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True)
            for ids, labels, real in rows:
                targets = labels[labels != IGNORE_INDEX].tolist()
                key = (tuple(targets), tuple(ids[real == 1].tolist()))
                seen[key] = seen.get(key, 0) + 1
        return seen

    assert epoch() == epoch()  # the same masked rows in every epoch, in any order
    copies = [static.select(range(c * 40, (c + 1) * 40))["labels"] for c in range(3)]
    differing = sum(copies[0][i] != copies[1][i] for i in range(40))
    assert differing >= 35
    again = static_masked_copies(dataset, vocab, rule(), dupe_factor=3, seed=11)
    assert again["input_ids"] == static["input_ids"]


def test_dynamic_masks_change_every_time_and_follow_torch_seed(tokenizer):
    rows = sequences(tokenizer, 16, seed=6)
    features = [{"input_ids": r[r != tokenizer.pad_token_id].tolist()} for r in rows]
    collate = DynamicMaskingCollator(tokenizer, rule())
    torch.manual_seed(0)
    first, second = collate(features), collate(features)
    labels = per_position_labels(first)
    assert not torch.equal(labels, per_position_labels(second))
    torch.manual_seed(0)
    assert torch.equal(per_position_labels(collate(features)), labels)
    assert (labels[first["attention_mask"] == 0] == IGNORE_INDEX).all()


@pytest.mark.parametrize("bad", [{"unit": "sentence"}, {"mlm_probability": 1.5},
                                 {"convention": "bert"},
                                 {"mask_token_fraction": 0.95}, {"max_predictions_per_seq": 0}])
@pytest.mark.parametrize("node", ["masking", "heldout.masking"])
def test_bad_masking_settings_name_the_key(bad, node):
    """A value out of its range is refused by the schema before a job starts (check_ranges),
    the shares' sum by the rule itself; either way one line naming the key."""
    (key, value), = bad.items()
    cfg = compose_config(["recipe=pretrain", f"{node}.{key}={value}"])
    with pytest.raises(BertkitError, match=rf"^(heldout\.)?masking\.{key}="):
        check_ranges(cfg)
        rule(**bad)


@pytest.mark.parametrize("convention", ["google", "non_special"])
def test_dynamic_collator_batch_statistics_and_phase_rules(tokenizer, convention):
    """The collator's batch path: the convention's exact count per row (with the rule of the
    row's length phase), never an excluded token or padding, labels only at masked positions,
    80/10/10."""
    vocab = Vocabulary.from_tokenizer(tokenizer)
    excluded = np.isin(np.arange(len(tokenizer)), list(excluded_ids(tokenizer, convention)))
    pool = len(tokenizer) if convention == "google" else len(tokenizer) - len(SPECIALS)
    short_rule = rule(max_predictions_per_seq=4, convention=convention)
    long_rule = rule(convention=convention)
    collate = DynamicMaskingCollator(tokenizer, [(60, short_rule), (LENGTH, long_rule)])
    torch.manual_seed(3)
    predicted = as_mask = unchanged = capped = 0
    rows = sequences(tokenizer, 3000, seed=9)
    for start in range(0, len(rows), 32):
        originals = [r[r != tokenizer.pad_token_id] for r in rows[start:start + 32]]
        batch = collate([{"input_ids": r.tolist()} for r in originals])
        for i, original in enumerate(originals):
            n_real = len(original)
            ids = np.full(batch["input_ids"].shape[1], tokenizer.pad_token_id)
            ids[:n_real] = original
            masked = batch["input_ids"][i].numpy()
            labels = per_position_labels(batch)[i].numpy()
            never = excluded[ids]
            chosen = labels != IGNORE_INDEX
            cap = 4 if n_real <= 60 else LENGTH
            capped += cap == 4 and expected_count(ids, tokenizer, convention) > 4
            assert chosen.sum() == expected_count(ids, tokenizer, convention, most=cap)
            assert not (chosen & never).any()
            assert (labels[chosen] == ids[chosen]).all()
            assert (masked[~chosen] == ids[~chosen]).all()
            if convention == "non_special":
                assert not vocab.special[masked[chosen & (masked != vocab.mask_id)]].any()
            predicted += chosen.sum()
            as_mask += (masked[chosen] == vocab.mask_id).sum()
            unchanged += (masked[chosen] == ids[chosen]).sum()
    assert capped > 100  # the short phase's cap was exercised
    assert as_mask / predicted == pytest.approx(0.8, abs=0.01)
    assert unchanged / predicted == pytest.approx(0.1 + 0.1 / pool, abs=0.01)

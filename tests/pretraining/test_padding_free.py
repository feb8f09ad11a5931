"""Padding-free batches (bertkit.pretraining.padding_free): on the same sequences and masks, the
packed batch's MLM and sentence losses and its gradients equal the padded batch's (fp32), for
MLM + NSP, SOP and MLM alone, at both phases; the batch sampler's order is a plain shuffle whose
batches fit their budget and hold almost no padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForPreTraining

from bertkit.pretraining import batches as padding_free
from bertkit.pretraining.batches import Phase, PhasedSampler
from bertkit.pretraining.masking import (
    IGNORE_INDEX,
    DynamicMaskingCollator,
    MaskingRule,
    StaticMasksCollator,
    Vocabulary,
    mask_sequence,
    most_predictions,
)
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining, use_padding_free_attention
from bertkit.pretraining.run import pretrain
from tests.conftest import compose_config
from tests.pretraining.test_mlm_masking import tokenizer  # noqa: F401 (fixture)
from tests.pretraining.test_pretrain_recipe import small_run

# (phase length, max_predictions_per_seq, batch size): the paper's two phases, scaled down.
PHASES = {"short": (32, 5, 6), "long": (96, 14, 3)}
RTOL, ATOL = 1e-5, 1e-6


def rule(predictions: int) -> MaskingRule:
    return MaskingRule(mlm_probability=0.15, mask_token_fraction=0.8, random_token_fraction=0.1,
                       max_predictions_per_seq=predictions, unit="token", span_geometric_p=0.2,
                       span_max_words=10)


def instances(tokenizer, count: int, longest: int, seed: int, pairs: bool):  # noqa: F811
    """Statically masked instances of 4..longest tokens: [CLS] A [SEP] B [SEP] with token
    types and a sentence label, or [CLS] text [SEP] alone (MLM)."""
    rng = np.random.default_rng(seed)
    words = np.arange(len(tokenizer.all_special_ids) + 1, len(tokenizer))
    vocab = Vocabulary.from_tokenizer(tokenizer)
    out = []
    for _ in range(count):
        length = int(rng.integers(4, longest + 1))
        body = rng.choice(words, size=length - (3 if pairs else 2)).tolist()
        if pairs:
            cut = int(rng.integers(1, len(body) + 1)) if body else 0
            ids = [tokenizer.cls_token_id, *body[:cut], tokenizer.sep_token_id, *body[cut:],
                   tokenizer.sep_token_id]
            types = [0] * (cut + 2) + [1] * (len(body) - cut + 1)
        else:
            ids = [tokenizer.cls_token_id, *body, tokenizer.sep_token_id]
            types = [0] * len(ids)
        masked, labels = mask_sequence(ids, vocab, rule(PHASES["long"][1]), rng)
        row = {"input_ids": masked.tolist(), "labels": labels.tolist(),
               "token_type_ids": types}
        if pairs:
            row["next_sentence_label"] = int(rng.integers(0, 2))
        out.append(row)
    return out


def lengths_of(rows) -> list[int]:
    return [len(row["input_ids"]) for row in rows]


def model(type_vocab_size: int, vocab_size: int) -> MaskedOnlyBertForPreTraining:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                        type_vocab_size=type_vocab_size, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    return MaskedOnlyBertForPreTraining(config).eval()


def losses_and_gradients(net, batch):
    net.zero_grad()
    out = net(**batch)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("objective", ["mlm_nsp", "sop", "mlm"])
def test_packed_losses_and_gradients_equal_the_padded_ones(tokenizer, phase, objective):  # noqa: F811
    length, predictions, batch_size = PHASES[phase]
    pairs = objective != "mlm"
    rows = instances(tokenizer, batch_size, length, seed=len(objective) + length, pairs=pairs)
    phases = [(length, predictions)]
    padded = StaticMasksCollator(tokenizer, phases)(rows)
    shapes = padding_free.pack_shapes([(length, predictions, np.mean(lengths_of(rows)))],
                                      batch_size, headroom=1.1)
    packed = StaticMasksCollator(tokenizer, phases, packed=shapes)(rows)

    # The packed batch: one row of the budget, every real token once, positions restarting.
    lengths = [len(row["input_ids"]) for row in rows]
    assert packed["input_ids"].shape == (1, batch_size * length)
    assert packed[padding_free.SEQUENCE_LENGTHS][:batch_size].tolist() == lengths
    assert packed["input_ids"][0, :sum(lengths)].tolist() == \
        [token for row in rows for token in row["input_ids"]]
    assert packed["position_ids"][0, :sum(lengths)].tolist() == \
        [p for n in lengths for p in range(n)]
    assert packed["mlm_positions"].shape == (1, batch_size * predictions)

    baseline = model(2 if pairs else 1, len(tokenizer))
    net = model(2 if pairs else 1, len(tokenizer))
    use_padding_free_attention(net)
    if not pairs:
        for batch in (padded, packed):
            batch.pop("token_type_ids", None)
    expected, expected_grads = losses_and_gradients(baseline, padded)
    got, grads = losses_and_gradients(net, packed)
    for name in ("loss", "mlm_loss_sum", "mlm_count", "mlm_correct"):
        torch.testing.assert_close(got[name], expected[name], rtol=RTOL, atol=ATOL)
    if pairs:
        for name in ("sentence_loss_sum", "sentence_count", "sentence_correct"):
            torch.testing.assert_close(got[name], expected[name], rtol=RTOL, atol=ATOL)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=RTOL, atol=ATOL,
                                   msg=lambda text, name=name: f"{name}: {text}")


def test_packed_attention_keeps_each_sequence_to_itself(tokenizer):  # noqa: F811
    """Changing one sequence changes no other sequence's hidden states."""
    rows = instances(tokenizer, 4, 32, seed=5, pairs=True)
    shapes = padding_free.pack_shapes([(32, 5, np.mean(lengths_of(rows)))], 4, headroom=1.1)
    collate = StaticMasksCollator(tokenizer, [(32, 5)], packed=shapes)
    net = model(2, len(tokenizer))
    use_padding_free_attention(net)
    changed = [dict(row) for row in rows]
    changed[1]["input_ids"] = [changed[1]["input_ids"][0]] + [7] * (len(rows[1]["input_ids"]) - 1)

    def hidden(batch):
        attention = padding_free.attention_inputs(batch["sequence_lengths"], 128, 32)
        return net.bert(batch["input_ids"], token_type_ids=batch["token_type_ids"],
                        position_ids=batch["position_ids"], **attention)[0][0]

    before, after = hidden(collate(rows)), hidden(collate(changed))
    ends = np.cumsum([len(row["input_ids"]) for row in rows])
    starts = ends - [len(row["input_ids"]) for row in rows]
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        same = torch.allclose(before[start:end], after[start:end])
        assert same == (index != 1)


def test_dynamic_masks_are_the_padded_ones_when_seeded_alike(tokenizer):  # noqa: F811
    """Dynamic masking draws each sequence's mask in the padded layout, packed or not."""
    rows = [{"input_ids": row["input_ids"]} for row in instances(tokenizer, 6, 32, 9, False)]
    rules = [(32, rule(5))]
    torch.manual_seed(3)
    padded = DynamicMaskingCollator(tokenizer, rules, static=False)(rows)
    torch.manual_seed(3)
    packed = DynamicMaskingCollator(
        tokenizer, rules, packed=padding_free.pack_shapes([(32, 5, 32)], 6, 1.0))(rows)
    mask = padded["attention_mask"].bool()
    assert packed["input_ids"][0, :int(mask.sum())].tolist() == padded["input_ids"][mask].tolist()
    used = packed["mlm_labels"] != IGNORE_INDEX
    assert sorted(packed["mlm_labels"][used].tolist()) == \
        sorted(padded["mlm_labels"][padded["mlm_labels"] != IGNORE_INDEX].tolist())


def test_batches_fit_their_budget_follow_a_plain_shuffle_and_hold_little_padding():
    rng = np.random.default_rng(0)
    # NSP-like lengths: most near the phase's length, a tenth shorter (short_seq_prob).
    lengths = np.where(rng.random(5000) < 0.1, rng.integers(8, 129, 5000),
                       rng.integers(100, 129, 5000))
    shape = padding_free.pack_shapes([(128, 20, lengths.mean())], 32, headroom=1.1)[0]
    predictions = most_predictions(lengths, rule(20))
    sampler = padding_free.PackedBatches([Phase(0, lengths, 0)], [shape], [predictions],
                                         batches=[120], seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 120
    seen = np.concatenate(batches)
    assert len(set(seen.tolist())) == len(seen)  # within one pass: each instance once
    for batch in batches:
        assert lengths[batch].sum() <= shape.tokens
        assert len(batch) <= shape.sequences
        assert predictions[batch].sum() <= shape.predictions
    padding = 1 - lengths[seen].sum() / (shape.tokens * len(batches))
    assert padding < 0.02, padding
    # A plain shuffle, not grouped by length: neighbours' lengths are nearly uncorrelated (the
    # short instances that fill a batch's end sit together), where a length-grouped order's
    # are nearly the same; and the order is the seed's.
    def neighbours(order):
        ordered = lengths[np.asarray(order)].astype(float)
        return np.corrcoef(ordered[:-1], ordered[1:])[0, 1]

    grouped = list(PhasedSampler([Phase(0, lengths, len(seen))], 32, seed=1,
                                 group_by_length=True))
    assert neighbours(seen) < 0.25 and neighbours(grouped) > 0.9
    again = padding_free.PackedBatches([Phase(0, lengths, 0)], [shape], [predictions],
                                       batches=[120], seed=1)
    assert [list(b) for b in again] == [list(b) for b in batches]
    # Two processes share the batches, every other one each.
    halves = [list(padding_free.PackedBatches([Phase(0, lengths, 0)], [shape], [predictions],
                                              batches=[120], seed=1, rank=rank, world_size=2))
              for rank in (0, 1)]
    assert halves[0] == batches[0::2] and halves[1] == batches[1::2]
    # Two phases, batches numbered across them: each process's length is what it yields.
    phases = [Phase(0, lengths[:2500], 0), Phase(2500, lengths[2500:], 0)]
    for rank in (0, 1):
        two = padding_free.PackedBatches(phases, [shape, shape], [predictions[:2500],
                                         predictions[2500:]], batches=[3, 2], seed=1,
                                         rank=rank, world_size=2)
        yielded = list(two)
        assert len(two) == len(yielded) == (3 if rank == 0 else 2)
        # Batches 0-2 are the first phase's, 3-4 the second's.
        assert all(index < 2500 for index in yielded[0])
        assert all(index >= 2500 for index in yielded[-1])


@pytest.mark.slow
def test_a_tiny_run_feeds_almost_no_padding(tmp_path):
    """The same tiny run, its batches at the phase's length as on a GPU (buckets_on_cpu):
    padded, a share of every batch is padding; padding-free, at most 2 %, on more sequences
    per step."""
    runs = {}
    for padding_free_setting in (False, True):
        runs[padding_free_setting] = pretrain(compose_config(small_run(**{
            "buckets_on_cpu": True, "pretraining.padding_free": padding_free_setting,
            "trainer.max_steps": 12})), tmp_path / str(padding_free_setting))
    padded, packed = runs[False], runs[True]
    assert not padded["padding_free"] and packed["padding_free"]
    assert padded["padding_fraction"] > 0.05
    assert packed["padding_fraction"] <= 0.02
    sequences = {key: run["train"]["throughput"]["samples"] for key, run in runs.items()}
    assert sequences[False] == 12 * 8 and sequences[True] > sequences[False]


@pytest.mark.slow
def test_a_resumed_padding_free_run_sees_the_batches_the_whole_run_sees(tmp_path):
    """The batch sampler is deterministic: resumed halfway, a run's later steps are the
    uninterrupted run's (the same losses), and its model loads in plain transformers."""
    settings = {"pretraining.padding_free": True, "trainer.max_steps": 8,
                "trainer.save_strategy": "steps", "trainer.save_steps": 2}
    whole = pretrain(compose_config(small_run(**settings)), tmp_path / "whole")
    pretrain(compose_config(small_run(**settings, train_fraction=0.5)), tmp_path / "resumed")
    resumed = pretrain(compose_config(small_run(**settings, resume=True)), tmp_path / "resumed")

    def losses(record):
        return {line["step"]: (line["mlm_loss"], line["nsp_loss"]) for line in record["log"]}

    later = {step: value for step, value in losses(whole).items() if step > 4}
    assert set(later) == {5, 6, 7, 8}
    for step, (mlm, nsp) in later.items():
        assert losses(resumed)[step] == pytest.approx((mlm, nsp), rel=1e-5), step
    plain = BertForPreTraining.from_pretrained(tmp_path / "resumed" / "model")
    assert plain.config._attn_implementation != padding_free.ATTENTION


@pytest.mark.parametrize(("gpu", "dropout", "kernel", "expected"), [
    (True, 0.0, True, True), (True, 0.1, True, False), (True, 0.0, False, False),
    (False, 0.0, True, False)])
def test_auto_is_on_where_the_variable_length_kernel_trains(monkeypatch, gpu, dropout, kernel,
                                                           expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(padding_free, "_varlen_kernel", lambda: object() if kernel else None)
    assert padding_free.padding_free_wanted("auto", dropout) is expected
    assert padding_free.padding_free_wanted(True, dropout) is True
    assert padding_free.padding_free_wanted(False, dropout) is False

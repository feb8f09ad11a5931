"""The masked-positions-only pretraining model against transformers' BertForPreTraining."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
)

from bertkit.pretraining.batches import per_position_labels, slots_of
from bertkit.pretraining.masking import Vocabulary
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining, load_pretraining_model
from bertkit.training.models import count_parameters, load_tokenizer
from bertkit.training.throughput import model_shape
from tests.conftest import compose_config


def tiny_config() -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32)


def batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 50, (4, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    labels = torch.full_like(input_ids, -100)
    chosen = torch.rand(input_ids.shape, generator=generator) < 0.3
    chosen[:, 0] = True
    labels[chosen & attention_mask.bool()] = input_ids[chosen & attention_mask.bool()]
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "token_type_ids": torch.zeros_like(input_ids), "labels": labels,
            "next_sentence_label": torch.tensor([0, 1, 1, 0])}


@pytest.fixture
def models():
    torch.manual_seed(0)
    ours = MaskedOnlyBertForPreTraining(tiny_config()).eval()
    reference = BertForPreTraining(tiny_config()).eval()
    reference.load_state_dict(ours.state_dict())
    return ours, reference


def test_loss_is_transformers_mlm_plus_nsp_loss(models):
    ours, reference = models
    inputs = batch()
    expected = reference(**inputs).loss
    output = ours(**inputs)
    torch.testing.assert_close(output.loss, expected)
    # The logged statistics match the reference logits.
    full = reference(**inputs)
    masked = inputs["labels"] != -100
    predicted = full.prediction_logits.argmax(-1)[masked]
    assert output.mlm_count.item() == masked.sum().item()
    assert output.mlm_correct.item() == (predicted == inputs["labels"][masked]).sum().item()
    nsp = torch.nn.functional.cross_entropy(full.seq_relationship_logits,
                                            inputs["next_sentence_label"])
    torch.testing.assert_close(output.sentence_loss_sum / 4, nsp)
    mlm = torch.nn.functional.cross_entropy(full.prediction_logits[masked],
                                            inputs["labels"][masked])
    torch.testing.assert_close(output.mlm_loss_sum / output.mlm_count, mlm)


def test_mlm_only_keeps_every_parameter_in_the_graph(models):
    ours, reference = models
    inputs = batch(1)
    del inputs["next_sentence_label"]
    output = ours(**inputs)
    full = reference(**inputs)
    masked = inputs["labels"] != -100
    torch.testing.assert_close(output.loss, torch.nn.functional.cross_entropy(
        full.prediction_logits[masked], inputs["labels"][masked]))
    output.loss.backward()
    assert all(p.grad is not None for p in ours.parameters())
    assert ours.cls.seq_relationship.weight.grad.abs().sum() == 0
    assert output.sentence_count is None


def test_saved_checkpoint_is_a_plain_bert(models, tmp_path):
    ours, _ = models
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForPreTraining"]
    classifier = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    torch.testing.assert_close(classifier.bert.embeddings.word_embeddings.weight,
                               ours.bert.embeddings.word_embeddings.weight)
    torch.testing.assert_close(classifier.bert.pooler.dense.weight, ours.bert.pooler.dense.weight)
    reloaded = BertForPreTraining.from_pretrained(tmp_path)
    torch.testing.assert_close(reloaded.cls.predictions.decoder.weight,
                               ours.bert.embeddings.word_embeddings.weight)


def test_fixed_slots_give_the_loss_and_statistics_of_per_position_labels(models):
    """bertkit's static-shape batches gather the masked positions into fixed slots (unused
    ones weighing 0): the loss and the logged counts equal the per-position computation."""
    ours, _ = models
    inputs = batch()
    chosen = (inputs["labels"] != -100).numpy()
    positions, slot_labels = slots_of(chosen, inputs["input_ids"].numpy(), slots=10)
    assert (slot_labels == -100).any()  # some slots unused
    slotted = {**{k: v for k, v in inputs.items() if k != "labels"},
               "mlm_positions": torch.from_numpy(positions),
               "mlm_labels": torch.from_numpy(slot_labels)}
    torch.testing.assert_close(per_position_labels(slotted), inputs["labels"], rtol=0, atol=0)
    expected, output = ours(**inputs), ours(**slotted)
    torch.testing.assert_close(output.loss, expected.loss)
    torch.testing.assert_close(output.mlm_loss_sum, expected.mlm_loss_sum)
    assert output.mlm_count.item() == expected.mlm_count.item() == chosen.sum()
    assert output.mlm_correct.item() == expected.mlm_correct.item()
    # Gradients too: the unused slots add nothing.
    ours.train()
    grads = []
    for fed in (inputs, slotted):
        ours.zero_grad()
        torch.manual_seed(1)
        ours(**fed).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in ours.parameters()
                                if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


def padded_pair(seed: int = 0):
    """(unpadded, padded): the same weights, the padded one's 50 vocabulary rows rounded up to
    64 by pad_vocabulary (pretraining.pad_vocab_to_multiple_of)."""
    torch.manual_seed(seed)
    unpadded = MaskedOnlyBertForPreTraining(tiny_config())
    padded = MaskedOnlyBertForPreTraining(tiny_config())
    padded.load_state_dict(unpadded.state_dict())
    padded.pad_vocabulary(64)
    return unpadded, padded


VOCABULARY_PARAMETERS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")


@pytest.mark.parametrize("slotted", [False, True])
def test_padded_vocabulary_gives_the_unpadded_losses_and_gradients(slotted):
    unpadded, padded = padded_pair()
    assert padded.config.vocab_size == 64 and padded.vocab_rows == 50
    assert padded.cls.predictions.decoder.weight is padded.bert.embeddings.word_embeddings.weight
    assert padded.cls.predictions.decoder.weight.shape == (64, 16)
    with torch.no_grad():  # padding rows that would win every argmax and most of the softmax
        padded.cls.predictions.bias[50:] = 1e4
    inputs = batch(2)
    if slotted:
        chosen = (inputs["labels"] != -100).numpy()
        positions, slot_labels = slots_of(chosen, inputs["input_ids"].numpy(), slots=10)
        inputs = {**{k: v for k, v in inputs.items() if k != "labels"},
                  "mlm_positions": torch.from_numpy(positions),
                  "mlm_labels": torch.from_numpy(slot_labels)}
    outputs = []
    for model in (unpadded, padded):  # fp32, train mode: the same dropout draws
        model.train()
        torch.manual_seed(1)
        outputs.append(model(**inputs))
        outputs[-1].loss.backward()
    expected, output = outputs
    torch.testing.assert_close(output.loss, expected.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(output.mlm_loss_sum, expected.mlm_loss_sum, rtol=1e-6, atol=1e-6)
    assert output.mlm_correct.item() == expected.mlm_correct.item() > 0
    assert output.sentence_correct.item() == expected.sentence_correct.item()
    grads = dict(padded.named_parameters())
    for name, parameter in unpadded.named_parameters():
        grad = grads[name].grad
        if name in VOCABULARY_PARAMETERS:
            assert grad.shape[0] == 64
            assert grad[50:].abs().sum() == 0  # the padding rows learn nothing
            grad = grad[:50]
        torch.testing.assert_close(grad, parameter.grad, rtol=1e-5, atol=1e-7)
    # The padding rows' logits are -inf: argmax never picks one; the mask is no parameter.
    logits = padded.vocabulary_logits(torch.randn(7, 16))
    assert logits.shape == (7, 64) and logits.dtype == torch.float32
    assert torch.isneginf(logits[:, 50:]).all() and torch.isfinite(logits[:, :50]).all()
    assert "vocab_padding_mask" not in padded.state_dict()
    assert all(torch.isfinite(parameter).all() for parameter in padded.parameters())


def test_padding_rows_stay_zero_under_adamw_with_weight_decay():
    _, padded = padded_pair()
    optimizer = torch.optim.AdamW(padded.parameters(), lr=1e-2, weight_decay=0.01)
    padded.train()
    for step in range(3):
        optimizer.zero_grad()
        padded(**batch(step)).loss.backward()
        optimizer.step()
    embeddings = padded.bert.embeddings.word_embeddings.weight
    assert torch.isfinite(embeddings).all() and torch.isfinite(padded.cls.predictions.bias).all()
    assert embeddings[50:].abs().sum() == 0 and padded.cls.predictions.bias[50:].abs().sum() == 0
    assert embeddings[:50].abs().sum() > 0


def test_padded_model_saves_a_plain_bert_at_the_tokenizer_size_and_reloads_padded(tmp_path):
    unpadded, padded = padded_pair()
    padded.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["vocab_size"] == 50 and config["architectures"] == ["BertForPreTraining"]
    assert padded.config.vocab_size == 64  # the running model keeps its padding
    for plain in (BertForPreTraining, BertForMaskedLM, BertForSequenceClassification):
        loaded = plain.from_pretrained(tmp_path)
        assert loaded.config.vocab_size == 50
        torch.testing.assert_close(loaded.bert.embeddings.word_embeddings.weight,
                                   unpadded.bert.embeddings.word_embeddings.weight)
    masked_lm = BertForMaskedLM.from_pretrained(tmp_path)
    torch.testing.assert_close(masked_lm.cls.predictions.bias, unpadded.cls.predictions.bias)
    # Trainer's resume: load_state_dict of the saved (unpadded) weights into a padded model.
    _, fresh = padded_pair(seed=1)
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    for (name, value), expected in zip(fresh.state_dict().items(),
                                       padded.state_dict().values(), strict=True):
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=name)
    # A state dict a caller hands in (Trainer under DDP/DeepSpeed) is unpadded as well.
    padded.save_pretrained(tmp_path / "given", state_dict=padded.state_dict())
    assert BertForPreTraining.from_pretrained(tmp_path / "given").config.vocab_size == 50


def test_padding_changes_neither_the_parameter_count_nor_the_flops():
    unpadded, padded = padded_pair()
    assert padded.vocab_padding_parameters == 14 * 17
    assert count_parameters(padded) == count_parameters(unpadded)
    assert model_shape(padded).config.vocab_size == 50
    assert model_shape(padded).config.hidden_size == 16
    with pytest.raises(ValueError, match="already padded"):
        padded.pad_vocabulary(64)


def test_load_pads_from_scratch_and_from_a_checkpoint_keeping_the_real_rows(vocab_dir, tmp_path):
    cfg = compose_config(["recipe=pretrain", "model=scratch_tiny", f"model.tokenizer={vocab_dir}",
                          "model.config.hidden_size=32", "model.config.intermediate_size=64"])
    assert cfg.pretraining.pad_vocab_to_multiple_of == 64  # the recipe's default
    tokenizer = load_tokenizer(cfg.model)
    size = len(tokenizer)
    assert size % 64 != 0
    torch.manual_seed(0)
    unpadded = load_pretraining_model(cfg.model, tokenizer)  # 1: not padded
    torch.manual_seed(0)
    padded = load_pretraining_model(cfg.model, tokenizer, 64)
    after = torch.rand(())  # padding draws nothing from the random state
    torch.manual_seed(0)
    load_pretraining_model(cfg.model, tokenizer)
    assert torch.rand(()) == after
    assert unpadded.config.vocab_size == padded.vocab_rows == size
    assert padded.config.vocab_size == -(-size // 64) * 64
    # The same initial weights on the real rows (bench-pretrain's plain way starts from them).
    padded_weights = padded.state_dict()
    for name, value in unpadded.state_dict().items():
        torch.testing.assert_close(padded_weights[name][:value.shape[0]], value, rtol=0, atol=0)
    # Random replacement draws from the tokenizer's ids: never a padding row.
    assert Vocabulary.from_tokenizer(tokenizer).replacement_ids.max() < size
    # Continued pretraining (model.name_or_path): the saved, unpadded checkpoint, padded again.
    padded.save_pretrained(tmp_path / "checkpoint")
    tokenizer.save_pretrained(tmp_path / "checkpoint")
    further = OmegaConf.merge(cfg.model, {"name_or_path": str(tmp_path / "checkpoint")})
    continued = load_pretraining_model(further, tokenizer, 64)
    assert continued.config.vocab_size == padded.config.vocab_size
    assert continued.vocab_rows == size
    for name, value in padded_weights.items():
        torch.testing.assert_close(continued.state_dict()[name], value, rtol=0, atol=0,
                                   msg=name)

"""The masked-positions-only pretraining model against transformers' BertForPreTraining."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification

from bertkit.pretraining.batches import per_position_labels, slots_of
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining


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

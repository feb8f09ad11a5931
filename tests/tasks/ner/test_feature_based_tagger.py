"""The feature-based tagger (the paper's Table 7): each layer combination against the encoder's
own hidden states, a frozen encoder that stays in eval mode, a BiLSTM that ignores padding,
the loss, and a saved tagger loaded back."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from bertkit.errors import BertkitError
from bertkit.tasks.ner.feature_based_tagger import (
    LAYER_COMBINATIONS,
    FeatureBasedTagger,
    check_settings,
    load_feature_based_tagger,
)


def encoder(layers: int = 4, dropout: float = 0.0) -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=layers,
                                num_attention_heads=2, intermediate_size=32,
                                hidden_dropout_prob=dropout,
                                attention_probs_dropout_prob=dropout))


def batch():
    input_ids = torch.tensor([[2, 7, 8, 9, 3, 0], [2, 10, 11, 12, 13, 3]])
    mask = (input_ids != 0).long()
    labels = torch.tensor([[-100, 1, -100, 2, -100, -100], [-100, 0, 3, 4, -100, -100]])
    return input_ids, mask, labels


@pytest.mark.parametrize("layers", sorted(LAYER_COMBINATIONS))
def test_layer_combinations(layers):
    model = encoder(layers=4)
    tagger = FeatureBasedTagger(model, 5, layers=layers, classifier="linear").eval()
    input_ids, mask, _ = batch()
    hidden = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
    h = hidden.hidden_states  # embeddings, layer 1, ..., layer 4
    assert len(h) == 5
    expected = {
        "embeddings": h[0], "last": h[4], "second_to_last": h[3],
        "sum_last_four": h[1] + h[2] + h[3] + h[4],
        "weighted_sum_last_four": (h[1] + h[2] + h[3] + h[4]) / 4,
        "concat_last_four": torch.cat([h[1], h[2], h[3], h[4]], dim=-1),
        "sum_all": h[1] + h[2] + h[3] + h[4],
        # Zero-initialised weights: the mean of the layers, scale 1.
        "weighted_sum_all": (h[1] + h[2] + h[3] + h[4]) / 4,
    }[layers]
    assert torch.allclose(tagger.features(h), expected, atol=1e-5)
    assert tagger.classifier.in_features == (64 if layers == "concat_last_four" else 16)
    output = tagger(input_ids=input_ids, attention_mask=mask)
    assert output.logits.shape == (2, 6, 5) and output.loss is None


def test_weighted_sums_learn_their_layer_weights():
    model = encoder(layers=6)
    input_ids, mask, _ = batch()
    h = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for layers, mixed in (("weighted_sum_all", h[1:]), ("weighted_sum_last_four", h[3:])):
        tagger = FeatureBasedTagger(model, 5, layers=layers, classifier="linear").eval()
        assert tagger.layer_weights.shape == (len(mixed),) and tagger.layer_weights.requires_grad
        with torch.no_grad():
            tagger.layer_weights.copy_(torch.log(torch.arange(1.0, len(mixed) + 1)))
            tagger.layer_scale.fill_(2.0)
        weights = torch.arange(1.0, len(mixed) + 1) / sum(range(1, len(mixed) + 1))
        expected = 2.0 * sum(w * layer for w, layer in zip(weights, mixed, strict=True))
        assert torch.allclose(tagger.features(h), expected, atol=1e-5)


def test_encoder_is_frozen_and_stays_in_eval_mode():
    tagger = FeatureBasedTagger(encoder(dropout=0.5), 5, layers="last", classifier="bilstm",
                                lstm_hidden_size=8, dropout=0.0)
    tagger.train()
    assert tagger.training and tagger.lstm.training
    assert not any(module.training for module in tagger.encoder.modules())
    assert not any(p.requires_grad for p in tagger.encoder.parameters())
    trainable = {name for name, p in tagger.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith(("lstm.", "classifier.")) for name in trainable)
    input_ids, mask, labels = batch()
    # No dropout anywhere with dropout 0 in the tagger: two passes in train mode agree, though
    # the encoder was built with dropout 0.5.
    first = tagger(input_ids=input_ids, attention_mask=mask).logits
    second = tagger(input_ids=input_ids, attention_mask=mask).logits
    assert torch.equal(first, second)
    output = tagger(input_ids=input_ids, attention_mask=mask, labels=labels)
    output.loss.backward()
    assert all(p.grad is None for p in tagger.encoder.parameters())
    assert tagger.classifier.weight.grad is not None


def test_loss_is_cross_entropy_over_labelled_tokens():
    tagger = FeatureBasedTagger(encoder(), 5, layers="last", classifier="linear").eval()
    input_ids, mask, labels = batch()
    output = tagger(input_ids=input_ids, attention_mask=mask, labels=labels)
    keep = labels != -100
    expected = torch.nn.functional.cross_entropy(output.logits[keep], labels[keep])
    assert torch.allclose(output.loss, expected)


def test_bilstm_does_not_read_padding():
    tagger = FeatureBasedTagger(encoder(), 5, layers="sum_last_four", classifier="bilstm",
                                lstm_hidden_size=8).eval()
    input_ids, mask, _ = batch()
    padded = tagger(input_ids=input_ids, attention_mask=mask).logits[0, :5]
    alone = tagger(input_ids=input_ids[:1, :5], attention_mask=mask[:1, :5]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def test_saved_tagger_loads_back(tmp_path):
    from safetensors.torch import save_file

    tagger = FeatureBasedTagger(encoder(), 5, layers="concat_last_four", classifier="bilstm",
                                lstm_hidden_size=8, lstm_layers=2).eval()
    save_file(tagger.state_dict(), str(tmp_path / "model.safetensors"))
    tagger.save_settings(tmp_path, ["O", "B-X", "I-X", "B-Y", "I-Y"])
    loaded, labels = load_feature_based_tagger(tmp_path)
    assert labels == ["O", "B-X", "I-X", "B-Y", "I-Y"]
    input_ids, mask, _ = batch()
    assert torch.allclose(loaded.eval()(input_ids=input_ids, attention_mask=mask).logits,
                          tagger(input_ids=input_ids, attention_mask=mask).logits)


def test_settings_errors():
    with pytest.raises(BertkitError, match="model.feature_based.layers='top'"):
        check_settings("top", "linear")
    with pytest.raises(BertkitError, match="model.feature_based.classifier='crf'"):
        check_settings("last", "crf")
    with pytest.raises(BertkitError, match="concat_last_four needs at least 4 encoder layers; "
                                           "the model has 2"):
        FeatureBasedTagger(encoder(layers=2), 5, layers="concat_last_four")

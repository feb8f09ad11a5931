"""The scalar mix of all layers and mean pooling (bertkit.finetuning.head_inputs) on tiny BERT task
models: a one-hot mix reads exactly one layer, the mix is saved and trained, mean pooling is the
masked mean and ignores padding, and the two compose."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

from bertkit.errors import BertkitError
from bertkit.finetuning.head_inputs import ScalarMix, add_layer_mix, scalar_mix_of, use_mean_pooling

TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64)
LAYERS, BATCH, SEQ = TINY["num_hidden_layers"], 3, 8


def tiny(cls, **config):
    torch.manual_seed(0)
    return cls(BertConfig(**TINY, **config))


def inputs(seed: int = 1, shape=(BATCH, SEQ)) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., -2:] = 0
    return {"input_ids": torch.randint(1, 60, shape, generator=g), "attention_mask": mask}


def one_hot(mix: ScalarMix, j: int) -> None:
    with torch.no_grad():
        mix.weights.fill_(-1e9)
        mix.weights[j] = 0.0


def test_mixture_sums_to_one_and_starts_uniform():
    mix = ScalarMix(LAYERS + 1)
    torch.testing.assert_close(mix.mixture(), torch.full((LAYERS + 1,), 1 / (LAYERS + 1)))
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.3, -2.0, 1.5]))
    torch.testing.assert_close(mix.mixture().sum(), torch.tensor(1.0))
    tensors = [torch.randn(2, 4, 5) for _ in range(LAYERS + 1)]
    expected = sum(w * t for w, t in zip(mix.mixture(), tensors, strict=True)) * mix.gamma
    torch.testing.assert_close(mix(tensors), expected)


@pytest.mark.parametrize("j", range(LAYERS + 1))
def test_one_hot_mix_reads_that_layer_for_tagging(j):
    model = tiny(BertForTokenClassification, num_labels=5).eval()
    batch = inputs()
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
        mix = add_layer_mix(model)
        one_hot(mix, j)
        logits = model(**batch).logits
    assert len(hidden) == LAYERS + 1
    assert torch.equal(logits, model.classifier(hidden[j]))


def test_one_hot_mix_on_the_last_layer_reproduces_the_classifier():
    model = tiny(BertForSequenceClassification, num_labels=3).eval()
    batch = inputs()
    with torch.no_grad():
        plain = model(**batch).logits
        one_hot(add_layer_mix(model), LAYERS)
        assert torch.equal(model(**batch).logits, plain)
        model.scalar_mix.gamma.fill_(2.0)  # gamma scales what the pooler reads
        assert not torch.allclose(model(**batch).logits, plain)


def test_span_head_reads_the_mix():
    model = tiny(BertForQuestionAnswering).eval()
    batch = inputs()
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
        one_hot(add_layer_mix(model), 1)
        out = model(**batch)
    start, end = model.qa_outputs(hidden[1]).split(1, dim=-1)
    assert torch.equal(out.start_logits, start.squeeze(-1))
    assert torch.equal(out.end_logits, end.squeeze(-1))


def test_mix_is_saved_trained_and_cleared(tmp_path):
    model = tiny(BertForSequenceClassification, num_labels=3).train()
    mix = add_layer_mix(model)
    assert model.scalar_mix is mix
    state = model.state_dict()
    assert {"scalar_mix.weights", "scalar_mix.gamma"} <= set(state)
    batch = {**inputs(), "labels": torch.tensor([0, 1, 2])}
    model(**batch).loss.backward()
    assert mix.weights.grad.abs().sum() > 0 and mix.gamma.grad.abs().sum() > 0
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert torch.equal(saved["scalar_mix.weights"], mix.weights.detach())
    fresh = tiny(BertForSequenceClassification, num_labels=3)
    add_layer_mix(fresh)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.scalar_mix.weights, mix.weights)
    with pytest.raises(BertkitError, match="finetuning.layer_mix"):
        add_layer_mix(model)


def test_multiple_choice_mix_and_output_hidden_states():
    model = tiny(BertForMultipleChoice).eval()
    batch = inputs(shape=(2, 3, SEQ))
    with torch.no_grad():
        plain = model(**batch).logits
        one_hot(add_layer_mix(model), LAYERS)
        out = model(**batch, output_hidden_states=True)
    assert torch.equal(out.logits, plain)
    assert len(out.hidden_states) == LAYERS + 1


def masked_mean(hidden, mask):
    rows = [hidden[i, mask[i].bool()].mean(dim=0) for i in range(len(hidden))]
    return torch.stack(rows)


def test_mean_pooling_is_the_masked_mean():
    model = tiny(BertForSequenceClassification, num_labels=3).eval()
    batch = inputs()
    batch["attention_mask"][1, 3:] = 0
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state
        use_mean_pooling(model)
        logits = model(**batch).logits
    expected = model.classifier(masked_mean(hidden, batch["attention_mask"]))
    torch.testing.assert_close(logits, expected)
    assert not any(p.requires_grad for p in model.bert.pooler.parameters())


def test_mean_pooling_ignores_padding():
    model = tiny(BertForSequenceClassification, num_labels=3).eval()
    use_mean_pooling(model)
    g = torch.Generator().manual_seed(3)
    short = torch.randint(1, 60, (1, 5), generator=g)
    long = torch.randint(1, 60, (1, 9), generator=g)
    padded = torch.cat([torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], dim=1), long])
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 5:] = 0
    with torch.no_grad():
        alone = model(input_ids=short).logits  # no attention_mask: every token counts
        together = model(input_ids=padded, attention_mask=mask).logits
    torch.testing.assert_close(together[:1], alone, rtol=0, atol=1e-6)


@pytest.mark.parametrize("cls", [BertForQuestionAnswering, BertForTokenClassification])
def test_mean_pooling_needs_a_pooled_head(cls):
    with pytest.raises(BertkitError, match="finetuning.pooling"):
        use_mean_pooling(tiny(cls))


def test_mix_and_mean_pooling_compose():
    model = tiny(BertForSequenceClassification, num_labels=3).eval()
    batch = inputs()
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
        mix = add_layer_mix(model)
        use_mean_pooling(model)
        mix.weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.5)
        logits = model(**batch).logits
        mixed = mix([*hidden])
    expected = model.classifier(masked_mean(mixed, batch["attention_mask"]))
    torch.testing.assert_close(logits, expected)
    model.train()
    model(**batch, labels=torch.tensor([0, 1, 2])).loss.backward()
    assert mix.weights.grad.abs().sum() > 0


def test_lora_trains_the_copy_of_the_mix():
    import peft

    model = tiny(BertForSequenceClassification, num_labels=3).train()
    add_layer_mix(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS, r=2, target_modules=["query", "value"],
        modules_to_save=["classifier", "scalar_mix"]))
    trained = scalar_mix_of(wrapped)
    assert trained is not model.scalar_mix and trained.weights.requires_grad
    wrapped(**inputs(), labels=torch.tensor([0, 1, 2])).loss.backward()
    assert trained.weights.grad.abs().sum() > 0

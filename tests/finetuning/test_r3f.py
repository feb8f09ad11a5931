"""The R3F regulariser (bertkit.finetuning.methods.r3f) on tiny BERT task models: zero with zero
noise, positive otherwise, off in eval mode, differentiable, linear in its weight, and defined
for every task model's outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.finetuning.methods.r3f import add_r3f, symmetric_kl
from tests.conftest import compose_config

TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BATCH, SEQ, CHOICES = 4, 10, 3


def tiny(cls, **config):
    torch.manual_seed(0)
    return cls(BertConfig(**TINY, **config))


def batch(kind: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, CHOICES, SEQ) if kind == "choice" else (BATCH, SEQ)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., -3:] = 0
    mask[0] = 1
    out = {"input_ids": torch.randint(1, 60, shape, generator=g), "attention_mask": mask,
           "token_type_ids": torch.zeros(shape, dtype=torch.long)}
    if kind == "classification":
        out["labels"] = torch.randint(0, 3, (BATCH,), generator=g)
    elif kind == "regression":
        out["labels"] = torch.randn(BATCH, generator=g)
    elif kind == "tagging":
        out["labels"] = torch.randint(0, 5, (BATCH, SEQ), generator=g)
    elif kind == "span":
        out["start_positions"] = torch.randint(0, SEQ - 3, (BATCH,), generator=g)
        out["end_positions"] = torch.randint(0, SEQ - 3, (BATCH,), generator=g)
    elif kind == "choice":
        out["labels"] = torch.randint(0, CHOICES, (BATCH,), generator=g)
    return out


MODELS = {
    "classification": (BertForSequenceClassification, {"num_labels": 3}),
    "regression": (BertForSequenceClassification, {"num_labels": 1}),
    "tagging": (BertForTokenClassification, {"num_labels": 5}),
    "span": (BertForQuestionAnswering, {}),
    "choice": (BertForMultipleChoice, {}),
}


def zeros(embeddings):
    return torch.zeros_like(embeddings)


def reference_kl(clean, noisy, mask=None):
    """KL(p||q) + KL(q||p) per distribution with F.kl_div, then the (masked) mean."""
    log_p, log_q = F.log_softmax(clean.double(), -1), F.log_softmax(noisy.double(), -1)
    rows = (F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
            + F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1))
    if mask is None:
        return rows.mean()
    return rows[mask.bool()].mean()


def test_symmetric_kl_matches_kl_div():
    g = torch.Generator().manual_seed(0)
    clean, noisy = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    torch.testing.assert_close(symmetric_kl(clean, noisy).double(), reference_kl(clean, noisy))
    clean, noisy = torch.randn(3, 7, 4, generator=g), torch.randn(3, 7, 4, generator=g)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    torch.testing.assert_close(symmetric_kl(clean, noisy, mask).double(),
                               reference_kl(clean, noisy, mask))
    # the masked positions do not count, whatever their logits
    changed = noisy.clone()
    changed[2, 5] += 100.0
    assert symmetric_kl(clean, changed, mask) == symmetric_kl(clean, noisy, mask)
    assert symmetric_kl(clean, clean) == 0


def test_zero_noise_leaves_the_loss_unchanged_and_noise_makes_it_larger():
    inputs = batch("classification")
    model = tiny(BertForSequenceClassification, num_labels=3, **NO_DROPOUT).train()
    plain = model(**inputs).loss
    state = add_r3f(model, 1.0, "normal", 1e-5, noise_fn=zeros)
    assert torch.equal(model(**inputs).loss, plain)
    assert state.last_value == 0
    state.noise_fn = state.sample
    state.eps = 1e-2
    assert model(**inputs).loss > plain
    assert state.last_value > 0
    state.remove()
    assert torch.equal(model(**inputs).loss, plain)


def test_eval_mode_is_untouched():
    inputs = batch("classification")
    model = tiny(BertForSequenceClassification, num_labels=3).eval()
    plain = model(**inputs).loss
    state = add_r3f(model, 1.0, "uniform", 1.0)
    assert torch.equal(model(**inputs).loss, plain)
    assert state.last_value is None


def test_gradient_flows_through_the_term():
    inputs = batch("classification")
    # a larger initialisation: the tiny model's predictions are otherwise nearly uniform
    model = tiny(BertForSequenceClassification, num_labels=3, initializer_range=0.5,
                 **NO_DROPOUT).train()
    state = add_r3f(model, 1.0, "normal", 0.1)
    model(**inputs).loss.backward()
    embeddings = model.bert.embeddings
    assert embeddings.word_embeddings.weight.grad.abs().sum() > 0
    # the term alone reaches the encoder (its gradient differs from the plain loss's)
    with_term = model.bert.encoder.layer[0].attention.self.query.weight.grad.clone()
    plain = tiny(BertForSequenceClassification, num_labels=3, initializer_range=0.5,
                 **NO_DROPOUT).train()
    plain(**inputs).loss.backward()
    difference = with_term - plain.bert.encoder.layer[0].attention.self.query.weight.grad
    assert state.last_value > 1e-4 and difference.abs().max() > 1e-4


@pytest.mark.parametrize("kind", list(MODELS))
def test_every_task_model_gets_a_finite_positive_term(kind):
    cls, config = MODELS[kind]
    model = tiny(cls, **config, **NO_DROPOUT).train()
    inputs = batch(kind)
    plain = model(**inputs).loss
    state = add_r3f(model, 1.0, "normal", 1e-2)
    loss = model(**inputs).loss
    assert torch.isfinite(state.last_value) and state.last_value > 0
    torch.testing.assert_close(loss, plain + state.last_value)
    state.noise_fn = zeros
    assert torch.equal(model(**inputs).loss, plain)


def test_tagging_term_ignores_padding():
    model = tiny(BertForTokenClassification, num_labels=5, **NO_DROPOUT).train()
    inputs = batch("tagging")
    noise = {}

    def fixed(embeddings):  # the same noise on the real tokens, any on the padding
        g = torch.Generator().manual_seed(noise.setdefault("seed", 0))
        n = torch.randn(embeddings.shape, generator=g) * 1e-2
        return n + noise.get("padding", 0) * (1 - inputs["attention_mask"]).unsqueeze(-1)

    state = add_r3f(model, 1.0, "normal", 1e-2, noise_fn=fixed)
    model(**inputs)
    first = state.last_value
    noise["padding"] = 5.0  # padded tokens are masked out of attention: only their logits change
    model(**inputs)
    torch.testing.assert_close(state.last_value, first)


def test_weight_scales_the_term_linearly():
    inputs = batch("span")
    losses = []
    for weight in (0.0, 1.0, 3.0):
        model = tiny(BertForQuestionAnswering, **NO_DROPOUT).train()
        torch.manual_seed(5)
        add_r3f(model, weight, "normal", 1e-2)
        losses.append(model(**inputs).loss)
    torch.testing.assert_close(losses[2] - losses[0], 3 * (losses[1] - losses[0]))
    assert losses[1] > losses[0]


def test_positional_inputs_and_peft_wrapping():
    import peft

    inputs = batch("classification")
    model = tiny(BertForSequenceClassification, num_labels=3, **NO_DROPOUT).train()
    state = add_r3f(model, 1.0, "normal", 1e-2)
    out = model(inputs["input_ids"], inputs["attention_mask"], labels=inputs["labels"])
    assert state.last_value > 0
    wrapped = peft.get_peft_model(model, peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS, r=2, target_modules=["query", "value"]))
    state.last_value = None
    wrapped.train()
    out = wrapped(**inputs)
    assert state.last_value > 0 and torch.isfinite(out.loss)


@pytest.mark.parametrize("overrides, key", [
    (["finetuning.r3f.weight=-1.0"], "finetuning.r3f.weight"),
    (["finetuning.r3f.weight=1.0", "finetuning.r3f.eps=0.0"], "finetuning.r3f.eps"),
    (["finetuning.r3f.weight=1.0", "finetuning.r3f.noise=gaussian"], "finetuning.r3f.noise"),
])
def test_bad_settings_name_the_key(overrides, key):
    """The schema refuses them before a finetune starts (add_r3f takes them as given)."""
    with pytest.raises(BertkitError, match=rf"^{key.replace('.', r'[.]')}=") as error:
        check_ranges(compose_config(["finetuning=r3f", *overrides]))
    assert "\n" not in str(error.value)

"""Gradual unfreezing trains every layer from its step on (and not before); re-initialising
the top layers draws them afresh from the model's own initializer and touches nothing else."""

from __future__ import annotations

import pytest
import torch
from transformers import BertForQuestionAnswering, BertForSequenceClassification, TrainerCallback

from bertkit.finetuning.methods import ActiveMethods
from tests.finetuning.method_fixtures import (
    method_trainer,
    settings,
    snapshot,
    tiny_classifier,
    tiny_config,
)

PROBES = {"embeddings": "bert.embeddings.word_embeddings.weight",
          "layer_0": "bert.encoder.layer.0.attention.self.query.weight",
          "layer_1": "bert.encoder.layer.1.output.dense.weight",
          "layer_2": "bert.encoder.layer.2.intermediate.dense.weight",
          "head": "classifier.weight"}


class Snapshots(TrainerCallback):
    """The probed weights after every optimizer step (index 0: before training)."""

    def __init__(self):
        self.weights: list[dict] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights.append({k: model.get_parameter(n).detach().clone()
                             for k, n in PROBES.items()})

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights.append({k: model.get_parameter(n).detach().clone()
                             for k, n in PROBES.items()})


def changed_in(snapshots: Snapshots, key: str) -> list[int]:
    """The steps (1-based) in which the weight moved."""
    w = snapshots.weights
    return [step for step in range(1, len(w)) if not torch.equal(w[step - 1][key], w[step][key])]


@pytest.mark.parametrize("decay", [1.0, 0.9])
def test_each_layer_stays_fixed_until_its_step_and_trains_after_it(tmp_path, decay):
    snapshots = Snapshots()
    trainer, methods = method_trainer(
        tiny_classifier(), settings("finetuning=gradual_unfreezing",
                                    "finetuning.unfreeze_every=2",
                                    f"finetuning.layer_lr_decay={decay}"),
        tmp_path, callbacks=[snapshots], max_steps=9)
    trainer.train()
    # Stage s covers steps 2s+1, 2s+2: the head and layer_2 first, then one more layer down.
    assert changed_in(snapshots, "head") == list(range(1, 10))
    assert changed_in(snapshots, "layer_2") == list(range(1, 10))
    assert changed_in(snapshots, "layer_1") == list(range(3, 10))
    assert changed_in(snapshots, "layer_0") == list(range(5, 10))
    assert changed_in(snapshots, "embeddings") == list(range(7, 10))
    assert methods.record()["unfrozen_at_step"] == {"layer_2": 0, "layer_1": 2, "layer_0": 4,
                                                    "embeddings": 6}


def test_unfreezing_by_epoch(tmp_path):
    snapshots = Snapshots()
    # 32 examples in batches of 8: 4 steps an epoch.
    trainer, _ = method_trainer(tiny_classifier(), settings("finetuning.unfreeze_every=epoch"),
                                 tmp_path, callbacks=[snapshots], max_steps=-1,
                                 num_train_epochs=3)
    trainer.train()
    assert changed_in(snapshots, "layer_2") == list(range(1, 13))
    assert changed_in(snapshots, "layer_1") == list(range(5, 13))
    assert changed_in(snapshots, "layer_0") == list(range(9, 13))
    assert changed_in(snapshots, "embeddings") == []


def checkpoint(tmp_path, initializer_range: float) -> str:
    """A saved classifier whose weights are far from the tiny model's initializer, so that
    re-initialised layers are told apart by their statistics."""
    torch.manual_seed(3)
    model = BertForSequenceClassification(tiny_config(initializer_range=initializer_range))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.fill_(0.3)
            elif "LayerNorm" in name:
                p.fill_(0.7)
    model.save_pretrained(tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


def test_reinit_draws_the_top_layers_afresh_and_leaves_the_rest(tmp_path):
    path = checkpoint(tmp_path, initializer_range=0.5)
    model = BertForSequenceClassification.from_pretrained(path, initializer_range=0.02)
    before = snapshot(model)
    ActiveMethods(settings("finetuning.reinit_layers=2")).apply(model)
    after = snapshot(model)
    for name in before:
        top = name.startswith(("bert.encoder.layer.1.", "bert.encoder.layer.2."))
        if not top:
            assert torch.equal(before[name], after[name]), name
            continue
        assert not torch.equal(before[name], after[name]), name
        value = after[name]
        if "LayerNorm.weight" in name:
            assert torch.all(value == 1.0)
        elif name.endswith("bias"):
            assert torch.all(value == 0.0)
        else:  # normal(0, initializer_range) of the model's config, not the checkpoint's 0.5
            assert abs(value.mean().item()) < 0.005, name
            assert value.std().item() == pytest.approx(0.02, rel=0.15), name


def test_reinit_is_recorded(tmp_path):
    model = tiny_classifier()
    methods = ActiveMethods(settings("finetuning=reinit"))
    methods.apply(model)
    assert methods.record() == {"reinitialised_layers": [2], "reinitialised_pooler": True}


@pytest.mark.parametrize("pooler", [True, False])
def test_the_preset_draws_the_pooler_afresh_unless_told_not_to(tmp_path, pooler):
    path = checkpoint(tmp_path, initializer_range=0.5)
    model = BertForSequenceClassification.from_pretrained(path, initializer_range=0.02)
    before = snapshot(model)
    flag = f"finetuning.reinit_pooler={str(pooler).lower()}"
    ActiveMethods(settings("finetuning=reinit", flag)).apply(model)
    after = snapshot(model)
    weight, bias = after["bert.pooler.dense.weight"], after["bert.pooler.dense.bias"]
    if pooler:  # the checkpoint's biases were 0.3 and its weights had std 0.5
        assert torch.all(bias == 0.0)
        assert weight.std().item() == pytest.approx(0.02, rel=0.15)
    else:
        assert torch.equal(weight, before["bert.pooler.dense.weight"])
        assert torch.equal(bias, before["bert.pooler.dense.bias"])
    assert torch.equal(after["classifier.weight"], before["classifier.weight"])
    assert torch.equal(after["bert.encoder.layer.1.output.dense.weight"],
                       before["bert.encoder.layer.1.output.dense.weight"])


def test_a_model_without_a_pooler_records_that_none_was_drawn():
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_config())  # span heads read the tokens: no pooler
    methods = ActiveMethods(settings("finetuning=reinit"))
    methods.apply(model)
    assert methods.record() == {"reinitialised_layers": [2], "reinitialised_pooler": False}

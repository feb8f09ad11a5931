"""Freezing, layer-wise learning-rate decay and its logged rates, and the settings' checks."""

from __future__ import annotations

import re

import pytest
import torch

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.finetuning.methods import ActiveMethods
from tests.conftest import compose_config
from tests.finetuning.method_fixtures import (
    method_trainer,
    settings,
    snapshot,
    tiny_classifier,
)

LAYERS = 3


def optimizer_names(trainer) -> list[str]:
    """Every parameter the optimizer holds, by name (a name twice if it is there twice)."""
    by_id = {id(p): n for n, p in trainer.model.named_parameters()}
    return [by_id[id(p)] for group in trainer.optimizer.param_groups for p in group["params"]]


def test_frozen_parameters_stay_bit_identical_and_are_not_in_the_optimizer(tmp_path):
    model = tiny_classifier()
    before = snapshot(model)
    trainer, _ = method_trainer(model, settings("finetuning=freeze",
                                                 "finetuning.freeze_layers=2"), tmp_path)
    trainer.train()
    frozen = [n for n in before if "embeddings" in n or re.search(r"layer\.[01]\.", n)]
    assert frozen and len(frozen) < len(before)
    after = snapshot(trainer.model)
    for name in frozen:
        assert torch.equal(before[name], after[name]), name
        assert not trainer.model.get_parameter(name).requires_grad
    # Trainer built its own optimizer: only what trains is in it.
    held = set(optimizer_names(trainer))
    assert held.isdisjoint(frozen)
    assert held == set(before) - set(frozen)
    assert not torch.equal(before["bert.encoder.layer.2.output.dense.weight"],
                           after["bert.encoder.layer.2.output.dense.weight"])


def expected_rate(name: str, base: float, decay: float, head: float) -> float:
    """An independent reading of Sun et al.'s rule: layer l of L at base * decay^(L - l)."""
    if name.startswith("bert.embeddings."):
        return base * decay ** LAYERS
    found = re.match(r"bert\.encoder\.layer\.(\d+)\.", name)
    if found:
        return base * decay ** (LAYERS - (int(found.group(1)) + 1))
    return base * head  # pooler and classifier


@pytest.mark.parametrize("decay,head", [(0.95, 1.0), (0.8, 5.0)])
def test_layerwise_groups_hold_each_parameter_once_at_its_rate(tmp_path, decay, head):
    trainer, _ = method_trainer(tiny_classifier(), settings(
        f"finetuning.layer_lr_decay={decay}", f"finetuning.head_lr_multiplier={head}"), tmp_path,
        learning_rate=2e-3)
    names = optimizer_names(trainer)
    assert sorted(names) == sorted(n for n, _ in trainer.model.named_parameters())  # once each
    by_id = {id(p): n for n, p in trainer.model.named_parameters()}
    for group in trainer.optimizer.param_groups:
        for parameter in group["params"]:
            name = by_id[id(parameter)]
            assert group["lr"] == pytest.approx(expected_rate(name, 2e-3, decay, head), rel=1e-12)
            no_decay = name.endswith(".bias") or "LayerNorm" in name
            assert group["weight_decay"] == (0.0 if no_decay else 0.01), name
    assert {g["name"] for g in trainer.optimizer.param_groups} >= {
        "embeddings", "embeddings/no_decay", "layer_0", "layer_2/no_decay", "head",
        "head/no_decay"}


def test_each_groups_rate_is_logged_and_follows_the_schedule(tmp_path):
    trainer, _ = method_trainer(tiny_classifier(), settings("finetuning=llrd",
                                                             "finetuning.layer_lr_decay=0.5"),
                                 tmp_path, lr_scheduler_type="linear", learning_rate=1e-3)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 6
    for entry in logs:
        assert entry["lr/head"] == pytest.approx(entry["learning_rate"])
        for layer in range(LAYERS):
            assert entry[f"lr/layer_{layer}"] == pytest.approx(
                entry["learning_rate"] * 0.5 ** (LAYERS - 1 - layer))
        assert entry["lr/embeddings"] == pytest.approx(entry["learning_rate"] * 0.5 ** LAYERS)
    rates = [entry["lr/embeddings"] for entry in logs]
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-1]  # linear decay


def test_plain_settings_leave_trainer_alone(tmp_path):
    model = tiny_classifier()
    trainer, methods = method_trainer(model, settings(), tmp_path)
    assert methods.plain and trainer.model is model and trainer.optimizer is None
    assert methods.record() == {}


@pytest.mark.parametrize("override,key", [
    ("finetuning.layer_lr_decay=1.5", "finetuning.layer_lr_decay"),
    ("finetuning.layer_lr_decay=0", "finetuning.layer_lr_decay"),
    ("finetuning.freeze_layers=-1", "finetuning.freeze_layers"),
    ("finetuning.pooling=max", "finetuning.pooling"),
    ("finetuning.unfreeze_every=0", "finetuning.unfreeze_every"),
    ("finetuning.unfreeze_every=2.5", "finetuning.unfreeze_every"),
    ("finetuning.r3f.weight=-1", "finetuning.r3f.weight"),
    ("finetuning.head_lr_multiplier=0", "finetuning.head_lr_multiplier"),
    ("finetuning.reinit_pooler=no", "finetuning.reinit_pooler"),
])
def test_bad_settings_name_their_key(override, key):
    """Each value's range is the schema's: refused in one line naming the key before a job
    starts (check_ranges; finetune() runs it too for callers other than run_job)."""
    with pytest.raises(BertkitError, match=rf"^{re.escape(key)}=") as error:
        check_ranges(compose_config([override]))
    assert "\n" not in str(error.value)


def test_more_layers_than_the_model_has_is_refused(tmp_path):
    with pytest.raises(BertkitError, match=r"finetuning.reinit_layers=4: the model has only 3"):
        ActiveMethods(settings("finetuning.reinit_layers=4")).apply(tiny_classifier())


def test_lora_with_freezing_is_refused():
    with pytest.raises(BertkitError, match="finetuning.lora.enabled"):
        ActiveMethods(settings("finetuning=lora", "finetuning.freeze_layers=1"))

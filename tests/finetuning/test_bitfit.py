"""BitFit, the method added as one module and one preset: only biases and the head move, the
registry finds it, and a run records it."""

from __future__ import annotations

from pkgutil import resolve_name as imported

import pytest

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.finetuning.methods import METHODS, ActiveMethods, describe, is_plain
from bertkit.jobs import run_job
from tests.conftest import compose_config, tiny_run_overrides
from tests.finetuning.method_fixtures import method_trainer, settings, snapshot, tiny_classifier


def test_only_biases_and_the_head_change_and_the_run_records_what_trained(tmp_path):
    model = tiny_classifier()
    before = snapshot(model)
    trainer, methods = method_trainer(model, settings("finetuning=bitfit"), tmp_path)

    trainer.train()

    after = snapshot(trainer.model)
    moved = {name for name in before if not before[name].equal(after[name])}
    encoder_biases = {name for name in before
                      if name.startswith("bert.") and name.endswith(".bias")
                      and not name.startswith("bert.pooler.")}
    head = {name for name in before
            if name.startswith(("classifier.", "bert.pooler."))}
    assert encoder_biases <= moved  # every encoder bias trained (AdamW moves each one)
    assert moved <= encoder_biases | head  # and no weight of the encoder
    assert any(name.endswith(".weight") for name in moved & head)
    expected = sum(p.numel() for name, p in model.named_parameters()
                   if name in encoder_biases | head)
    record = methods.record()["bitfit"]
    assert record["trained_parameters"] == expected
    assert record["trained_share"] == pytest.approx(
        expected / sum(p.numel() for p in model.parameters()), abs=1e-6)


def test_the_registry_finds_the_module_and_the_preset_turns_it_on():
    assert imported(METHODS["bitfit"].method).__module__ == "bertkit.finetuning.methods.bitfit"
    assert not is_plain(settings("finetuning=bitfit"))
    assert is_plain(settings("finetuning=full"))
    assert describe(settings("finetuning=bitfit"))["bitfit"] is True


@pytest.mark.parametrize("override", ["finetuning.freeze_layers=1",
                                      "finetuning.lora.enabled=true"])
def test_bitfit_with_another_choice_of_what_trains_is_refused(override):
    with pytest.raises(BertkitError, match="finetuning.bitfit=true decides itself what trains"):
        ActiveMethods(settings("finetuning=bitfit", override))


def test_a_bitfit_that_is_no_switch_is_refused():
    """'yes' would read as on (so would 'no'): the schema takes true or false only."""
    with pytest.raises(BertkitError, match="^finetuning.bitfit='yes': expected true or false$"):
        check_ranges(compose_config(["finetuning=bitfit", "finetuning.bitfit=yes"]))


@pytest.mark.slow  # a run
def test_a_glue_run_with_the_preset_records_bitfit(glue_dir, vocab_dir, tmp_path):
    """`bertkit recipe=glue finetuning=bitfit`: the template picks the method up from the
    registry with no other change."""
    record = run_job(compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir,
                                                       finetuning="bitfit")), tmp_path / "run")

    assert record["hyperparameters"]["finetuning"]["name"] == "bitfit"
    assert record["hyperparameters"]["finetuning"]["bitfit"] is True
    facts = record["details"]["finetuning"]["bitfit"]
    assert 0 < facts["trained_share"] < 0.5

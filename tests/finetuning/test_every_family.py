"""Every finetuning method runs through the one template for every family (GLUE, SQuAD, SWAG,
NER): a tiny end-to-end run per family with the methods combined, recorded in metrics.json;
and LoRA's merged model, saved beside its adapter."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from bertkit.jobs import run_job
from tests.conftest import compose_config, tiny_run_overrides
from tests.tasks.ner.test_ner_recipe import conll_files, ner_overrides  # noqa: F401
from tests.tasks.ner.test_ner_recipe import write_vocab as ner_vocab
from tests.tasks.squad.test_squad_features import write_vocab as squad_vocab
from tests.tasks.squad.test_squad_recipe import squad_files, squad_overrides  # noqa: F401
from tests.tasks.swag.test_swag_recipe import swag_files, swag_overrides  # noqa: F401

COMBINED = {"finetuning.name": "combined", "finetuning.layer_lr_decay": 0.9,
            "finetuning.head_lr_multiplier": 2.0, "finetuning.reinit_layers": 1,
            "finetuning.freeze_embeddings": True, "finetuning.layer_mix": True,
            "finetuning.r3f.weight": 1.0}
LORA = {"finetuning": "lora", "finetuning.lora.r": 4}


@pytest.fixture
def family_run(glue_dir, vocab_dir, squad_files, swag_files, conll_files, tmp_path):  # noqa: F811
    """family, settings -> the config of a tiny run of that family with those settings."""

    def make(family: str, settings: dict):
        if family == "glue":
            return compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir,
                                                     **settings))
        if family == "squad":
            train, dev = squad_files("v1.1")
            return compose_config(squad_overrides("squad_v1", train, dev,
                                                  squad_vocab(tmp_path / "vocab"), tmp_path,
                                                  **settings))
        if family == "swag":
            return compose_config(swag_overrides(*swag_files, tmp_path, **settings))
        return compose_config(ner_overrides(conll_files(), ner_vocab(tmp_path / "vocab"),
                                            tmp_path, **settings))

    return make


@pytest.mark.parametrize("family", ["glue", "squad", "swag", "ner"])
def test_the_methods_combined_run_for_every_family(family, family_run, tmp_path):
    pooling = {"finetuning.pooling": "mean"} if family in ("glue", "swag") else {}
    # keep_checkpoints: their log history is read below
    record = run_job(family_run(family, {**COMBINED, **pooling, "keep_checkpoints": True}),
                     tmp_path / "run")
    settings = record["hyperparameters"]["finetuning"]
    assert settings["name"] == "combined" and settings["layer_lr_decay"] == 0.9
    facts = record["details"]["finetuning"]
    assert facts["reinitialised_layers"] == [1]
    assert facts["frozen_parameters"] > 0
    mix = facts["layer_mix"]["weights"]
    assert len(mix) == 3 and sum(mix) == pytest.approx(1.0, abs=1e-5)
    assert record["main_value"] == record["main_value"]  # a number, not NaN
    # The learned mix is saved with the model.
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert any(key.startswith("scalar_mix.") for key in saved)
    for path in (tmp_path / "run" / "checkpoints").glob("checkpoint-*/trainer_state.json"):
        # The per-group learning rates are in the log history (the embeddings are frozen).
        logged = [e for e in json.loads(path.read_text())["log_history"] if "loss" in e]
        assert logged and all("lr/embeddings" not in e and "lr/layer_0" in e for e in logged)


@pytest.mark.parametrize("family", ["glue", "squad", "swag", "ner"])
def test_lora_trains_saves_its_adapter_and_evaluates_the_merged_model(family, family_run,
                                                                      tmp_path):
    record = run_job(family_run(family, LORA), tmp_path / "run")
    lora = record["details"]["finetuning"]["lora"]
    assert 0 < lora["trainable_parameters"] < lora["all_parameters"]
    adapter = tmp_path / "run" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    head = {"glue": "classifier", "squad": "qa_outputs", "swag": "classifier",
            "ner": "classifier"}[family]
    assert any(f".{head}." in key for key in load_file(str(adapter /
                                                           "adapter_model.safetensors")))
    merged = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert not any("lora_" in key or "modules_to_save" in key for key in merged)
    assert record["main_value"] == record["main_value"]

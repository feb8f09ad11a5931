"""The objective registry (bertkit.pretraining.objective): every preset of conf/objective/ is a
registered objective and back, a preset's key set to another objective's value is refused
naming it, and a new objective is one module and one YAML: nothing else names it."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertkit.config_schema import check_ranges
from bertkit.config_tree import config_dir
from bertkit.errors import BertkitError
from bertkit.pretraining import objective as registry
from bertkit.pretraining.objective import DESCRIBED_BY, objective_of, registered
from bertkit.pretraining.run import check_pretraining_config, pretrain
from tests.conftest import compose_config
from tests.pretraining.test_pretrain_recipe import small_run

PRESETS = sorted(path.stem for path in (Path(config_dir()) / "objective").glob("*.yaml"))


def test_every_preset_is_a_registered_objective_and_back():
    assert PRESETS == sorted(registered())
    for name in PRESETS:
        cfg = compose_config(["recipe=pretrain", f"objective={name}"])
        objective = objective_of(cfg.objective)
        assert objective.name == cfg.objective.name == name
        for key in DESCRIBED_BY:
            assert cfg.objective[key] == getattr(objective, key)


@pytest.mark.parametrize(("override", "message"), [
    ("objective.sentence_task=sop",
     "objective.sentence_task=sop: objective=mlm_nsp's is nsp (conf/objective/mlm_nsp.yaml); "
     "objective=sop has it"),
    ("objective.packing=full_sentences",
     "objective.packing=full_sentences: objective=mlm_nsp's is pairs "
     "(conf/objective/mlm_nsp.yaml); objective=mlm has it"),
    # The schema's choices are the registry's names, and the schema is checked first.
    ("objective.name=nsp", "objective.name='nsp': expected one of mlm, mlm_nsp, sop"),
])
def test_a_key_that_is_not_the_objectives_is_refused_naming_it(override, message):
    cfg = compose_config(["recipe=pretrain", "objective=mlm_nsp", override])
    with pytest.raises(BertkitError) as raised:
        check_pretraining_config(cfg)
    assert str(raised.value) == message


# The whole of a new objective: masked LM on one sentence per sequence.
MODULE = '''
"""Masked LM on one sentence per sequence (a test's objective)."""

from bertkit.pretraining.objective import Objective, register


@register
class OneSentence(Objective):
    title = "masked LM on single sentences"
    packing = "sentences"

    def instances(self, tokenized, tokenizer, *, max_seq_length, short_seq_prob, seed,
                  copies=1, num_proc=None):
        def build(batch):
            return self.buffer_rows(batch["sentence_ids"], None, max_seq_length=max_seq_length,
                                    short_seq_prob=short_seq_prob,
                                    cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id)

        return tokenized.map(build, batched=True, remove_columns=tokenized.column_names)

    def buffer_rows(self, documents, rng, *, max_seq_length, short_seq_prob, cls_id, sep_id):
        rows = [[cls_id, *sentence[:max_seq_length - 2], sep_id]
                for document in documents for sentence in document]
        return {"input_ids": rows, "token_type_ids": [[0] * len(ids) for ids in rows],
                "length": [len(ids) for ids in rows]}
'''
PRESET = """
name: mlm_sentences
sentence_task: null
packing: sentences
"""


def test_a_new_objective_is_one_module_and_one_yaml(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "OBJECTIVES", dict(registry.OBJECTIVES))  # the test's own
    module_path = tmp_path / "mlm_sentences.py"
    module_path.write_text(textwrap.dedent(MODULE))
    spec = importlib.util.spec_from_file_location("mlm_sentences", module_path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    presets = tmp_path / "conf" / "objective"
    presets.mkdir(parents=True)
    (presets / "mlm_sentences.yaml").write_text(PRESET)

    cfg = compose_config(small_run(**{"objective": "mlm_sentences", "masking": "dynamic",
                                      "hydra.searchpath": f"[file://{tmp_path / 'conf'}]"}))
    check_ranges(cfg)  # the schema's choices are the registry's
    summary = pretrain(cfg, tmp_path / "run")
    assert summary["train"]["steps"] == 8
    assert summary["objective"] == summary["hyperparameters"]["objective"] == "mlm_sentences"
    last = summary["last_log"]
    assert "mlm_loss" in last and not any(key.startswith(("nsp_", "sop_")) for key in last)
    recorded = OmegaConf.load(tmp_path / "run" / "config.yaml").objective
    assert (recorded.name, recorded.sentence_task, recorded.packing) == (
        "mlm_sentences", None, "sentences")
    # One sentence a sequence: far shorter than full-sentence packing's 64-token sequences.
    assert summary["data"]["instances"][0]["mean_length"] < 32

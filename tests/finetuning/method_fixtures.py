"""A tiny BERT classifier, random data and a Trainer run through the methods, for the tests of
bertkit.finetuning: each method applied as the finetune template applies it."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from bertkit.finetuning.methods import ActiveMethods
from tests.conftest import compose_config

VOCAB, LENGTH = 60, 12


def tiny_config(**extra) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=2, intermediate_size=37, max_position_embeddings=64,
                      **extra)


def tiny_classifier(seed: int = 0, **extra) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_config(**extra))


class RandomPairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, VOCAB, (n, LENGTH), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def settings(*overrides: str):
    """The finetuning node as `bertkit finetuning=... <overrides>` composes it."""
    return compose_config(list(overrides)).finetuning


def method_trainer(model, node, tmp_path, callbacks=(),
                   **arguments) -> tuple[Trainer, ActiveMethods]:
    """A Trainer around the prepared model, with the methods attached, not yet trained."""
    methods = ActiveMethods(node)
    model = methods.apply(model)
    options = {"max_steps": 6, "per_device_train_batch_size": 8, "learning_rate": 1e-3,
               "warmup_steps": 0, "weight_decay": 0.01, "logging_steps": 1,
               "report_to": [], "save_strategy": "no", "use_cpu": True, "seed": 0,
               "disable_tqdm": True, **arguments}
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "out"),
                                                          **options),
                      train_dataset=RandomPairs(), callbacks=list(callbacks))
    methods.attach(trainer)
    return trainer, methods


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}

"""Freezing the embeddings and the bottom encoder layers (Lee et al. 2019)."""

from __future__ import annotations

from bertkit.finetuning.checks import within_layers
from bertkit.finetuning.freezing import freeze
from bertkit.finetuning.method import Method, register


@register
class Freeze(Method):
    order = 50

    @classmethod
    def active(cls, settings) -> bool:
        return bool(settings.freeze_embeddings) or settings.freeze_layers != 0

    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        within_layers("freeze_layers", settings.freeze_layers, num_layers)

    def apply(self, model):
        frozen = set(freeze(model, self.settings.freeze_embeddings, self.settings.freeze_layers))
        self.frozen = sum(p.numel() for n, p in model.named_parameters() if n in frozen)
        return model

    def record(self) -> dict:
        return {"frozen_parameters": self.frozen}

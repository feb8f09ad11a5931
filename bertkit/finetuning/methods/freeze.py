"""Freezing the embeddings and the bottom encoder layers (Lee et al. 2019)."""

from __future__ import annotations

from bertkit.finetuning.layers import freeze
from bertkit.finetuning.methods import Method, within_layers


class Freeze(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        within_layers("freeze_layers", settings.freeze_layers, num_layers)

    def apply(self, model):
        frozen = set(freeze(model, self.settings.freeze_embeddings, self.settings.freeze_layers))
        self.frozen = sum(p.numel() for n, p in model.named_parameters() if n in frozen)
        return model

    def record(self) -> dict:
        return {"frozen_parameters": self.frozen}

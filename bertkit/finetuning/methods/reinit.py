"""Re-initialising the top encoder layers and the pooler before finetuning (Zhang et al. 2021)."""

from __future__ import annotations

from bertkit.finetuning.checks import within_layers
from bertkit.finetuning.method import Method, register
from bertkit.finetuning.reinitialise import reinit_top_layers


@register
class Reinit(Method):
    order = 10

    @classmethod
    def active(cls, settings) -> bool:
        return settings.reinit_layers != 0 or bool(settings.get("reinit_pooler", False))

    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        within_layers("reinit_layers", settings.reinit_layers, num_layers)

    def apply(self, model):
        pooler = bool(self.settings.get("reinit_pooler", False))
        self.layers, self.pooler = reinit_top_layers(model, self.settings.reinit_layers,
                                                     pooler=pooler)
        return model

    def record(self) -> dict:
        return {"reinitialised_layers": self.layers, "reinitialised_pooler": self.pooler}

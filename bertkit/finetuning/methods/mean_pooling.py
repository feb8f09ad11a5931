"""Mean pooling over the tokens instead of [CLS] through the pooler (Reimers & Gurevych 2019)."""

from __future__ import annotations

from bertkit.errors import BertkitError
from bertkit.finetuning.method import Method, register

POOLING = ("cls", "mean")


@register
class MeanPooling(Method):
    order = 30

    @classmethod
    def active(cls, settings) -> bool:
        return settings.pooling == "mean"

    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        if settings.pooling not in POOLING:
            raise BertkitError(f"finetuning.pooling={settings.pooling!r}: expected one of "
                               f"{', '.join(POOLING)}")

    def apply(self, model):
        from bertkit.finetuning.head_inputs import use_mean_pooling

        use_mean_pooling(model)
        return model

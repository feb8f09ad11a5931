"""Mean pooling over the tokens instead of [CLS] through the pooler (Reimers & Gurevych 2019)."""

from __future__ import annotations

from bertkit.finetuning.method import Method, register

POOLING = ("cls", "mean")  # finetuning.pooling's choices (config_schema)


@register
class MeanPooling(Method):
    order = 30

    @classmethod
    def active(cls, settings) -> bool:
        return settings.pooling == "mean"

    def apply(self, model):
        from bertkit.finetuning.head_inputs import use_mean_pooling

        use_mean_pooling(model)
        return model

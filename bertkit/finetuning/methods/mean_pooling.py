"""Mean pooling over the tokens instead of [CLS] through the pooler (Reimers & Gurevych 2019)."""

from __future__ import annotations

from bertkit.finetuning.methods import Method


class MeanPooling(Method):
    def apply(self, model):
        from bertkit.finetuning.head_inputs import use_mean_pooling

        use_mean_pooling(model)
        return model

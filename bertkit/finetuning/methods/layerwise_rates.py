"""Layer-wise learning-rate decay (Sun et al. 2019; ULMFiT's discriminative rates) and the
head's own rate: one optimizer group per depth."""

from __future__ import annotations

from bertkit.finetuning.method import Method, register


@register
class LayerwiseRates(Method):
    order = 70

    @classmethod
    def active(cls, settings) -> bool:
        return settings.layer_lr_decay != 1.0 or settings.head_lr_multiplier != 1.0

    def needs_layer_groups(self) -> bool:
        return True

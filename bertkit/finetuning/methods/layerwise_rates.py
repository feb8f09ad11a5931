"""Layer-wise learning-rate decay (Sun et al. 2019; ULMFiT's discriminative rates) and the
head's own rate: one optimizer group per depth."""

from __future__ import annotations

from bertkit.finetuning.checks import positive
from bertkit.finetuning.method import Method, register


@register
class LayerwiseRates(Method):
    order = 70

    @classmethod
    def active(cls, settings) -> bool:
        return settings.layer_lr_decay != 1.0 or settings.head_lr_multiplier != 1.0

    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        positive(settings.layer_lr_decay, "layer_lr_decay", upper=1.0)
        positive(settings.head_lr_multiplier, "head_lr_multiplier")

    def needs_layer_groups(self) -> bool:
        return True

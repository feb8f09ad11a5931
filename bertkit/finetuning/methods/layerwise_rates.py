"""Layer-wise learning-rate decay (Sun et al. 2019; ULMFiT's discriminative rates) and the
head's own rate: one optimizer group per depth."""

from __future__ import annotations

from bertkit.finetuning.methods import Method


class LayerwiseRates(Method):
    def needs_layer_groups(self) -> bool:
        return True

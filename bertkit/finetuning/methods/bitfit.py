"""BitFit (Ben Zaken et al. 2022): only the bias terms of the encoder train, with the task head.
Added as the example of a new method: this module, its line in METHODS and
conf/finetuning/bitfit.yaml."""

from __future__ import annotations

from bertkit.errors import BertkitError
from bertkit.finetuning.layers import HEAD, depth_of
from bertkit.finetuning.methods import Method


class BitFit(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        if (settings.freeze_layers or settings.freeze_embeddings
                or settings.unfreeze_every is not None or settings.lora.enabled):
            raise BertkitError("finetuning.bitfit=true decides itself what trains (the biases "
                               "and the head): it does not combine with "
                               "finetuning.freeze_embeddings, finetuning.freeze_layers, "
                               "finetuning.unfreeze_every or finetuning.lora.enabled")

    def apply(self, model):
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(depth_of(name) == HEAD or name.endswith(".bias"))
        self.trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.total = sum(p.numel() for p in model.parameters())
        return model

    def record(self) -> dict:
        return {"bitfit": {"trained_parameters": self.trained,
                           "trained_share": round(self.trained / self.total, 6)}}

"""Gradual unfreezing (Howard & Ruder 2018): the head and the top layer first, one more layer
down every `unfreeze_every` optimizer steps (or epoch)."""

from __future__ import annotations

from bertkit.errors import BertkitError
from bertkit.finetuning.callbacks import GradualUnfreezing as Schedule
from bertkit.finetuning.layers import HEAD, depth_of, num_layers
from bertkit.finetuning.methods import Method


class GradualUnfreezing(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        if settings.freeze_layers or settings.freeze_embeddings:
            raise BertkitError("finetuning.unfreeze_every unfreezes every layer in turn: it "
                               "does not combine with finetuning.freeze_embeddings or "
                               "finetuning.freeze_layers")

    def needs_layer_groups(self) -> bool:
        return True

    def trains_later(self, name: str) -> bool:
        return depth_of(name) != HEAD

    def callbacks(self, trainer) -> list:
        if trainer.args.world_size > 1:
            raise BertkitError("finetuning.unfreeze_every does not run under torchrun: "
                               "DistributedDataParallel fixes the trained parameters when it "
                               "wraps the model, so layers unfrozen later would never be "
                               "synchronised")
        self.schedule = Schedule(trainer.model, num_layers(trainer.model),
                                 self.settings.unfreeze_every)
        return [self.schedule]

    def record(self) -> dict:
        unit = "epoch" if self.schedule.every == "epoch" else "step"
        return {f"unfrozen_at_{unit}": {("embeddings" if d == 0 else f"layer_{d - 1}"): s
                                        for d, s in sorted(self.schedule.unfrozen_at.items())}}

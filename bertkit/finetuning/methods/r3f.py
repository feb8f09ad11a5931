"""R3F: a smoothness term between predictions on clean and noised embeddings
(Aghajanyan et al. 2021)."""

from __future__ import annotations

from bertkit.finetuning.callbacks import LogR3F
from bertkit.finetuning.methods import Method


class R3F(Method):
    def apply(self, model):
        from bertkit.finetuning.r3f_loss import add_r3f

        r3f = self.settings.r3f
        self.state = add_r3f(model, float(r3f.weight), r3f.noise, float(r3f.eps))
        return model

    def log_callbacks(self) -> list:
        return [LogR3F(self.state)]

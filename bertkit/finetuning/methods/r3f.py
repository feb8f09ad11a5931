"""R3F: a smoothness term between predictions on clean and noised embeddings
(Aghajanyan et al. 2021)."""

from __future__ import annotations

from bertkit.errors import BertkitError
from bertkit.finetuning.callbacks import LogR3F
from bertkit.finetuning.method import Method, register
from bertkit.finetuning.r3f_loss import check_r3f


@register
class R3F(Method):
    order = 40

    @classmethod
    def active(cls, settings) -> bool:
        return settings.r3f.weight > 0

    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        r3f = settings.r3f
        if isinstance(r3f.weight, bool) or not isinstance(r3f.weight, (int, float)) \
                or r3f.weight < 0:
            raise BertkitError(f"finetuning.r3f.weight={r3f.weight!r}: expected a number >= 0 "
                               f"(0: off)")
        if r3f.weight > 0:  # the regulariser's own check, as add_r3f runs it
            check_r3f(r3f.weight, r3f.noise, r3f.eps)

    def apply(self, model):
        from bertkit.finetuning.r3f_loss import add_r3f

        r3f = self.settings.r3f
        self.state = add_r3f(model, float(r3f.weight), r3f.noise, float(r3f.eps))
        return model

    def log_callbacks(self) -> list:
        return [LogR3F(self.state)]

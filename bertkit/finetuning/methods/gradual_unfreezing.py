"""Gradual unfreezing (Howard & Ruder 2018): the head and the top layer first, one more layer
down every `unfreeze_every` optimizer steps (or epoch)."""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from bertkit.errors import BertkitError
from bertkit.finetuning.layers import HEAD, depth_of, num_layers, set_trainable
from bertkit.finetuning.methods import Method

logger = logging.getLogger(__name__)


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


class Schedule(TrainerCallback):
    """ULMFiT's schedule: stage 0 trains the head and the top layer; each stage unfreezes the
    next layer down, the embeddings last. A stage lasts `every` optimizer steps, or an epoch.

    The stage is a function of the step (or epoch), applied before each step, so a run resumed
    from a checkpoint trains exactly the layers the uninterrupted run would.
    """

    def __init__(self, model, num_layers: int, every: int | str):
        self.model, self.num_layers, self.every = model, num_layers, every
        self.stage = None
        # depth -> when its stage began (an optimizer step, or an epoch with every="epoch"):
        # the schedule's, so a resumed run records what the uninterrupted one would.
        self.unfrozen_at: dict[int, int] = {}

    def trainable_depths(self, stage: int) -> set[int]:
        top = self.num_layers  # depth of the top layer
        return set(range(max(0, top - stage), top + 1))

    def apply(self, stage: int, step: int) -> None:
        if stage == self.stage:
            return
        depths = self.trainable_depths(stage)
        set_trainable(self.model, depths, True)
        set_trainable(self.model, set(range(self.num_layers + 1)) - depths, False)
        for depth in sorted(depths - set(self.unfrozen_at)):
            began = self.num_layers - depth  # the stage that unfroze it
            self.unfrozen_at[depth] = began if self.every == "epoch" else began * self.every
        self.stage = stage
        logger.info("gradual unfreezing: step %d, training depths %s (0: embeddings)",
                    step, sorted(depths))

    def on_train_begin(self, args, state, control, **kwargs):
        self.apply(self.stage_at(state), state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self.apply(self.stage_at(state), state.global_step)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.apply(self.stage_at(state), state.global_step)

    def stage_at(self, state) -> int:
        if self.every == "epoch":
            return int(state.epoch or 0)
        return state.global_step // self.every

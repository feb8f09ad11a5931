"""The finetuning methods' behaviour during training, through Trainer's callbacks: gradual
unfreezing, and each optimizer group's learning rate in the logs (W&B curves lr/<group>)."""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from bertkit.finetuning.layers import set_trainable

logger = logging.getLogger(__name__)


class GroupLearningRates(TrainerCallback):
    """Adds lr/<depth> (embeddings, layer_i, head) to each training log: the rate each group
    stepped with, read before the optimizer step (the scheduler moves it right after). Put first
    among the callbacks, so that the reporting callbacks (W&B) see the added keys; they go into
    the state's log history too (trainer_state.json)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.rates: dict[str, float] = {}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # <depth> and <depth>/no_decay share a rate.
        self.rates = {f"lr/{group['name'].split('/')[0]}": group["lr"]
                      for group in self.optimizer.param_groups}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs and self.rates:
            logs.update(self.rates)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self.rates)
        return control


class GradualUnfreezing(TrainerCallback):
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


class LogR3F(TrainerCallback):
    """The R3F term (unweighted, of the latest batch) in each training log as r3f: how far the
    predictions move under the noise. First among the callbacks, like GroupLearningRates."""

    def __init__(self, r3f):
        self.r3f = r3f

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs and self.r3f.last_value is not None:
            logs["r3f"] = float(self.r3f.last_value)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1]["r3f"] = logs["r3f"]
        return control

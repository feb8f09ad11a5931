"""When a run stops before its schedule ends, through Trainer's callbacks, from the config:
early stopping on the dev metric, and stopping at a share of the schedule (successive halving's
early rungs). (The finetuning methods' callbacks are bertkit.finetuning.callbacks.)"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf
from transformers import EarlyStoppingCallback, Trainer, TrainerCallback

from bertkit.errors import BertkitError


def add_early_stopping(cfg: DictConfig, trainer: Trainer) -> None:
    """early_stopping.patience: Trainer's EarlyStoppingCallback on the checkpoint-selecting
    metric; checked here so that a missing setting is one message, not Trainer's assertion."""
    settings = OmegaConf.select(cfg, "early_stopping")
    if settings is None or settings.patience is None:
        return
    args = trainer.args
    # The config's value: TrainingArguments fills in "loss" by itself, which GLUE's evaluation
    # names eval_validation_loss, and Trainer would then turn early stopping off with a warning.
    watched = OmegaConf.select(cfg, "trainer.metric_for_best_model")
    if not watched or not args.load_best_model_at_end:
        raise BertkitError("early_stopping.patience needs trainer.metric_for_best_model (the dev "
                           "metric to watch, e.g. validation_accuracy for GLUE) and "
                           "trainer.load_best_model_at_end=true")
    if args.eval_strategy == "no":
        raise BertkitError("early_stopping.patience needs evaluations: set trainer.eval_strategy "
                           "to epoch or steps")
    trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=int(settings.patience),
                                               early_stopping_threshold=settings.threshold))


class StopAtFraction(TrainerCallback):
    """Stop (and save a checkpoint) once `fraction` of the planned optimizer steps are done.

    The schedule stays the whole run's (learning-rate decay over all planned steps), so a run
    continued with resume=true goes on exactly as if it had never stopped.
    """

    def __init__(self, fraction: float):
        self.fraction = fraction
        self.stopped = False

    def stop_step(self, max_steps: int) -> int:
        return max(1, math.ceil(self.fraction * max_steps))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.stop_step(state.max_steps):
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True
            # At an epoch's end the uninterrupted run evaluates before going on, and every
            # evaluation draws from the RNG (a DataLoader iterator takes a seed): evaluate now,
            # so that the checkpoint (saved after evaluating) holds the RNG state the
            # uninterrupted run continues from.
            at_epoch_end = abs(state.epoch - round(state.epoch)) < 1e-9
            if str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "epoch" \
                    and at_epoch_end:
                control.should_evaluate = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped:
            control.should_evaluate = False  # done in on_step_end, before the checkpoint
        return control


def add_train_fraction(cfg: DictConfig, trainer: Trainer) -> StopAtFraction | None:
    share = OmegaConf.select(cfg, "train_fraction")
    if share is None:
        return None
    if float(share) == 1.0:
        return None
    callback = StopAtFraction(float(share))
    trainer.add_callback(callback)
    return callback

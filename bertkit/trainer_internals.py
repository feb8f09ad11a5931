"""Every edit bertkit makes to a built transformers.Trainer beyond its public methods, in one
place. Trainer has no public way to put a callback before the reporting ones, to hand it a
layer-wise optimizer after the model it holds was prepared, or to swap in LoRA's merged model
for the final evaluation; each edit below is pinned by tests/test_trainer_internals.py against
the installed transformers, so a release that moves one fails that test, not a user's run.
(Trainer's private sampler hooks, _get_train_sampler/_get_eval_sampler, are overridden in
bertkit.training.trainer and bertkit.pretraining.trainer and pinned there too;
_wrap_model, to evaluate the compiled model, in bertkit.training.static_shapes, pinned by
tests/training/test_compiled_graphs.py's count of evaluation graphs.)
"""

from __future__ import annotations


def put_first(trainer, callback) -> None:
    """Before every other callback: Trainer puts the reporting callbacks (W&B) before any
    given to it, so a callback that adds keys to the logs must go first for them to be
    reported."""
    trainer.callback_handler.callbacks.insert(0, callback)


def callbacks_of(trainer) -> list:
    """The trainer's callbacks, in the order Trainer calls them."""
    return list(trainer.callback_handler.callbacks)


def use_optimizer(trainer, optimizer) -> None:
    """Trainer creates an optimizer only when it holds none: one set before train() is the
    one that steps, and Trainer's scheduler drives each of its groups."""
    trainer.optimizer = optimizer


def replace_model(trainer, model) -> None:
    """After train(): evaluation, prediction and saving use `model` (LoRA's merged weights)."""
    trainer.model = model
    trainer.model_wrapped = model


def put_last(trainer, callback) -> None:
    """After every other callback (added later ones included): what it does at a step's end
    sees what the others decided there."""
    callbacks = trainer.callback_handler.callbacks
    if callback in callbacks:
        callbacks.remove(callback)
    callbacks.append(callback)

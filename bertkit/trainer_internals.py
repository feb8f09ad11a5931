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


# Trainer's training-loss sums, for one train() call: the sum drained from the device at each
# logging step (_total_loss_scalar), the sum of the steps since (_tr_loss, on the device), and
# the step the current logging window began after (_globalstep_last_logged). Trainer sets the
# three before it calls on_train_begin, and adds the last window to the drained sum before
# its closing log line; read and set here so that a resumed run carries them on
# (bertkit.training.trainer.CarriedTotals).

def loss_sums(trainer) -> dict:
    """The training-loss sums at this step (a read of the device: at saves only)."""
    window = getattr(trainer, "_tr_loss", None)
    return {"drained": float(getattr(trainer, "_total_loss_scalar", 0.0)),
            "window": 0.0 if window is None else float(window.item()),
            "window_after_step": int(getattr(trainer, "_globalstep_last_logged", 0))}


def restore_loss_sums(trainer, sums: dict) -> None:
    """Puts sums taken by loss_sums back into a trainer whose train() has just begun: its
    logging windows and its training loss go on as if never interrupted."""
    trainer._total_loss_scalar = float(sums["drained"])
    trainer._tr_loss += float(sums["window"])
    trainer._globalstep_last_logged = int(sums["window_after_step"])


def drained_loss_sum(trainer) -> float:
    """The training-loss sum drained so far (after training: over every step it ran)."""
    return float(trainer._total_loss_scalar)


def average_loss_window(trainer) -> None:
    """Each process's training-loss sum since the last logging step, replaced by its mean over
    the processes: the logged loss (Trainer's mean over processes of each one's window) stays
    the same, and any one process's window is now what a resumed run must carry."""
    trainer._tr_loss = trainer.accelerator.reduce(trainer._tr_loss.detach().clone(),
                                                  reduction="mean")

"""Preemption: a signal stops the run at the end of the current step, with a checkpoint.

SLURM and most schedulers send SIGTERM some seconds before they kill a preempted job; a
submitit job gets its own signal (USR2 by default: SUBMITIT_PREEMPT_SIGNAL), on which submitit
requeues the job and exits at once, losing everything since the last periodic checkpoint.
Here the signal only raises a flag. At the end of an optimizer step Trainer saves a
checkpoint and stops (every process of a distributed run at the same step: the flag is
reduced over them every `agree_every_steps` steps), then the job ends with Preempted: exit
status 128 + the signal for a
plain job; for submitit, its own handler runs now (checkpoint/requeue), and the requeued job
continues from that checkpoint with resume=auto.

The grace period may be 30 s for everything, so after the signal the run does nothing a
resume does not need: callbacks that score (the held-out evaluation) ask `preempting` and
skip, and Trainer's end of training neither loads the best checkpoint back (the process
exits) nor, under save_total_limit=1, deletes the checkpoint just saved as not the best; no
metrics.json, model or card is written after it (Preempted unwinds the job).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import torch
from transformers import TrainerCallback

from bertkit.trainer_internals import callbacks_of

logger = logging.getLogger(__name__)

SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


class Preempted(Exception):
    """The run saved a checkpoint and stopped on a preemption signal."""

    def __init__(self, signum: int, step: int, checkpoint_dir: str, handler=None):
        self.signum, self.step, self.handler = signum, step, handler
        super().__init__(f"preempted by {signal.Signals(signum).name} at step {step}: checkpoint "
                         f"saved in {checkpoint_dir}; the same command with resume=auto "
                         f"continues from it")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def hand_over(self) -> None:
        """Runs the handler the signal had before the run (submitit's checkpoint/requeue,
        which exits), if it had one."""
        if callable(self.handler):
            self.handler(self.signum, None)


def preemption_signals() -> list[int]:
    """SIGTERM, and submitit's preemption signal inside a submitit job."""
    signals = [signal.SIGTERM]
    if os.environ.get("SUBMITIT_JOB_ID") or os.environ.get(SUBMITIT_SIGNAL_ENV):
        name = os.environ.get(SUBMITIT_SIGNAL_ENV, "USR2").upper().removeprefix("SIG")
        submitit = getattr(signal, f"SIG{name}", None)
        if submitit is not None and submitit not in signals:
            signals.append(submitit)
    return signals


class PreemptionCallback(TrainerCallback):
    """Catches the preemption signals during training; saves and stops at the step's end."""

    def __init__(self, signals: list[int] | None = None, agree_every_steps: int = 1):
        """agree_every_steps: under DDP, the processes compare their flags at every this many
        optimizer steps (one collective each time, not one per step)."""
        self.signals = preemption_signals() if signals is None else signals
        self.agree_every_steps = max(1, int(agree_every_steps))
        self.received: int | None = None
        self.stopped_at: int | None = None
        self.previous: dict[int, object] = {}

    def _catch(self, signum, frame):
        logger.warning("caught %s: saving a checkpoint at the end of this step, then stopping",
                       signal.Signals(signum).name)
        self.received = signum

    def on_train_begin(self, args, state, control, **kwargs):
        # Python runs signal handlers in the main thread only (a run in a worker thread, as
        # some launchers do, keeps the default behaviour).
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self.previous[signum] = signal.signal(signum, self._catch)

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_process_received(state.global_step):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step:
            # Saved in this checkpoint's trainer_state.json, where the resume reads it; in
            # memory it would make Trainer's end of training load the best model back, and
            # under save_total_limit=1 delete this checkpoint as not the best.
            state.best_model_checkpoint = None

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """The handlers from before training. Also called when training raises (on_train_end
        never runs then): a handler left behind would outlive the run, and a process forked
        later (a datasets worker pool) would ignore the SIGTERM that ends it."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _any_process_received(self, step: int) -> bool:
        """Every process stops at the same step: the schedulers signal them at different
        moments, and a process that saved alone would wait for the others forever. They agree
        at every agree_every_steps-th step only: a collective and its read-back stop the host
        until the GPU drains, and a scheduler's grace period spans many steps."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.received is not None
        if step % self.agree_every_steps:
            return False
        flag = torch.tensor([0 if self.received is None else self.received], dtype=torch.int64)
        if torch.distributed.get_backend() == "nccl":
            flag = flag.cuda()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = int(flag.item())
        return bool(flag.item())

    def raise_if_stopped(self, checkpoint_dir: str) -> None:
        """After Trainer.train returned: Preempted when a signal stopped it."""
        if self.stopped_at is not None:
            raise Preempted(self.received, self.stopped_at, checkpoint_dir,
                            self.previous.get(self.received))


def preempting(trainer) -> bool:
    """Whether a preemption signal has reached `trainer`'s run: slow work it would do now
    (scoring) is not what a resume needs, and the grace period is short."""
    return any(isinstance(callback, PreemptionCallback) and callback.received is not None
               for callback in callbacks_of(trainer))

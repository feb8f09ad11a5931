"""The held-out score during pretraining: at step 0, every heldout.every_seconds of training
time (or every_steps), and at the end, each evaluation a `heldout/*` line of the log history
(a resumed run does not score where it resumes: its curve is the uninterrupted run's).

Evaluations run with the training clock paused and outside the throughput meter's windows, so
measuring a run does not change how much it trains. The lines go through trainer.log: W&B
gets them against the step (under train/heldout/...), and trainer_state.json keeps them, so a
resumed run's curve still holds the evaluations made before the resume. Every process
evaluates (no collective call; the set is small); only the main process writes files. After a
preemption signal nothing is scored (bertkit.training.checkpoints): the run saves and exits
within the scheduler's grace period, and the resumed run scores at its end.
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from bertkit.errors import BertkitError
from bertkit.pretraining.heldout import (
    HeldoutSet,
    describe_set,
    heldout_collator,
    majority_label_share,
    score_heldout,
)
from bertkit.training.budget import TrainingClock
from bertkit.training.checkpoints import preempting
from bertkit.training.throughput import excluded_from_throughput

PREFIX = "heldout/"
LOSS_KEY = f"{PREFIX}mlm_loss"  # the key that marks a held-out line in the log history
STEP, TOKENS, ELAPSED = "step", "tokens_seen", "elapsed_seconds"


def evaluate_heldout(model, heldout: HeldoutSet, collator, batch_size: int) -> dict:
    """The MLM scores on the MLM set; the sentence task's on the pair set."""
    scores = score_heldout(model, heldout.mlm, collator, batch_size)
    result = {"mlm_loss": scores["mlm_loss"], "mlm_accuracy": scores["mlm_accuracy"]}
    if heldout.pairs is not None:
        task = heldout.sentence_task
        pairs = score_heldout(model, heldout.pairs, collator, batch_size, sentence_task=task)
        result.update({key: pairs[key] for key in (f"{task}_loss", f"{task}_accuracy")
                       if key in pairs})
    return result


class HeldoutEvaluation(TrainerCallback):
    def __init__(self, trainer: Trainer, heldout: HeldoutSet, clock: TrainingClock, *,
                 batch_size: int, every_seconds: float | None = None,
                 every_steps: int | None = None, tokenizer=None):
        """tokenizer (for padding): the trainer's processing_class unless given."""
        tokenizer = tokenizer if tokenizer is not None else trainer.processing_class
        if tokenizer is None:
            raise BertkitError("HeldoutEvaluation needs a tokenizer to pad the held-out "
                               "batches: give tokenizer=, or the Trainer a processing_class")
        if (every_seconds is None) == (every_steps is None):
            raise BertkitError("HeldoutEvaluation: give exactly one of every_seconds and "
                               "every_steps")
        self.trainer = trainer
        self.heldout = heldout
        self.clock = clock
        self.batch_size = batch_size
        self.every_seconds = every_seconds
        self.every_steps = every_steps
        self.collator = heldout_collator(tokenizer)
        self._last_step: int | None = None
        self._last_elapsed = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        scored = [line for line in state.log_history if LOSS_KEY in line]
        if scored:  # a resumed run: its earlier evaluations are in the log history
            self._last_step = scored[-1][STEP]
            self._last_elapsed = scored[-1][PREFIX + ELAPSED]
        # At step 0 only: a resumed run's curve is the uninterrupted run's, the next
        # evaluation due on the clock or step count carried over.
        if state.global_step == 0 and self._last_step != 0:
            self._evaluate(state)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._due(state):
            # trainer.log resets control.should_log (CallbackHandler.on_log): keep Trainer's
            # own training log line of this step, due right after the callbacks.
            should_log = control.should_log
            self._evaluate(state)
            control.should_log = should_log
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._last_step != state.global_step and not preempting(self.trainer):
            self._evaluate(state)
        return control

    def _due(self, state) -> bool:
        if self._last_step == state.global_step or preempting(self.trainer):
            return False
        if self.every_steps is not None:
            return state.global_step % self.every_steps == 0
        return self.clock.elapsed() - self._last_elapsed >= self.every_seconds

    def _evaluate(self, state) -> None:
        elapsed = self.clock.elapsed()  # training time up to here; the evaluation is paused
        with self.clock.paused(), excluded_from_throughput(self.trainer):
            scores = evaluate_heldout(self.trainer.model, self.heldout, self.collator,
                                      self.batch_size)
        self._last_step, self._last_elapsed = state.global_step, elapsed
        flush = getattr(self.trainer, "flush_step_counters", None)
        if flush is not None:  # the tokens counted on the device, into the state
            flush()
        self.trainer.log({**{PREFIX + key: value for key, value in scores.items()},
                          PREFIX + TOKENS: state.num_input_tokens_seen,
                          PREFIX + ELAPSED: elapsed})


def heldout_curve(log_history: list[dict]) -> list[dict]:
    """Every held-out evaluation of the log history: step, tokens_seen, elapsed_seconds and
    the scores, without the prefix."""
    return [{STEP: line[STEP], **{key[len(PREFIX):]: value for key, value in line.items()
                                  if key.startswith(PREFIX)}}
            for line in log_history if LOSS_KEY in line]


def heldout_record(heldout: HeldoutSet, train_documents: int, log_history: list[dict],
                   settings) -> dict:
    """metrics.json's "heldout": the sets (sizes, fingerprints), the curve and the final
    evaluation."""
    curve = heldout_curve(log_history)
    pairs = None
    if heldout.pairs is not None:
        pairs = {"sentence_task": heldout.sentence_task, **describe_set(heldout.pairs),
                 "majority_accuracy": majority_label_share(heldout.pairs)}
    return {"fraction": settings.fraction, "seed": settings.seed,
            "documents": heldout.documents, "train_documents": train_documents,
            **describe_set(heldout.mlm), "pairs": pairs,
            "curve": curve, "final": curve[-1] if curve else None}

"""Trainer's step without host syncs between logging steps, for every bertkit trainer.

On a GPU, anything that reads a device value on the host (`.item()`, `bool(tensor)`, a
data-dependent shape) stops Python until the GPU has run every kernel queued before it, so the
next step's kernels start late. Counted with bertkit.benchmarks.host_syncs, Trainer's own step
made three or four per step; each is moved here to the device, or to logging steps only:

- the NaN/Inf filter of the logged loss (trainer.logging_nan_inf_filter): Trainer asks
  `torch.isnan(loss) or torch.isinf(loss)` every micro-batch. Here a non-finite loss is
  replaced on the device by the mean of the window's finite ones (Trainer adds the mean of the
  window so far: the same idea) and counted; the count is logged as `nonfinite_losses` when not
  zero. Evaluation keeps Trainer's own filter (on host arrays, no sync).
- tokens seen (trainer.include_num_input_tokens_seen): Trainer gathers and `.item()`s the count
  every step; here it is summed on the device and added to state.num_input_tokens_seen at
  logging, saving and the end of training (one collective each time under DDP).
- the FLOPs Trainer logs (floating_point_ops): Trainer walks the model's parameters in Python
  every step; here the per-token count is taken once (the same 6 x non-embedding parameters x
  tokens).
- the attention mask (bertkit.training.padding_masks): transformers asks the GPU whether a
  padding mask is all ones before SDPA; a batch without padding goes without a mask (unless
  compiled: one graph per shape), and a padded one as the 4D mask transformers would build,
  which it uses as given.

The last step is a logging step too (LogLastStep): Trainer logs at every logging_steps only,
so a run shorter than logging_steps (trainer.max_steps=3, logging_steps=100) ended on step 1's
line, and the final losses printed and sent to W&B were step 1's.

Trainer's own flags are turned off on the arguments this trainer holds (their values are kept
and acted on here), so the rest of Trainer's loop is unchanged.
"""

from __future__ import annotations

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import IntervalStrategy, speed_metrics

from bertkit.trainer_internals import put_last
from bertkit.training.padding_masks import (
    SEQUENCE_LENGTHS,
    attach_padding_masks,
    without_full_masks,
)
from bertkit.training.static_shapes import FixedRowsTrainer


class LeanStepTrainer(FixedRowsTrainer, Trainer):
    """Trainer with the step's host syncs moved to logging steps (module docstring), and its
    batches at full rows where static shapes pay (bertkit.training.static_shapes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = getattr(self.args, "_bertkit_lean_settings", None)
        if settings is None:  # the user's settings, taken once per arguments object
            tokens = self.args.include_num_input_tokens_seen
            tokens = {True: "all", False: "no"}.get(tokens, tokens)
            settings = (bool(self.args.logging_nan_inf_filter), str(tokens))
            self.args._bertkit_lean_settings = settings
            self.args.logging_nan_inf_filter = False
            self.args.include_num_input_tokens_seen = "no"
        self.filter_nonfinite, self.count_tokens = settings
        self._lean_window = _DeviceWindow()
        self._flops_per_token: int | None = None
        # Compiled, a batch with and one without a mask would be two graphs: keep the mask.
        if self.data_collator is not None and not self.args.torch_compile:
            self.data_collator = without_full_masks(self.data_collator)
        attach_padding_masks(self.model)
        if self.args.torch_compile:
            # Trainer compiles with dynamic=None: at a second batch width dynamo would trace a
            # dynamic-shape graph (slower kernels, no CUDA graphs). bertkit's widths are a few
            # phases or buckets, known ahead: one static graph each.
            torch._dynamo.config.automatic_dynamic_shapes = False
        self._flush_callback = FlushAtLoggingSteps(self)
        self.add_callback(self._flush_callback)
        self._last_step_callback = LogLastStep()
        self.add_callback(self._last_step_callback)

    @property
    def last_logging_window(self) -> tuple[int, int] | None:
        """(first, last) optimizer step of the last training log line: its losses are the
        mean over these steps (Trainer's window); None before any line."""
        return self._last_step_callback.window

    # -- the step -------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.count_tokens != "no":
            self._lean_window.add_tokens(self._tokens_of(inputs))
        if self.filter_nonfinite:
            loss = self._lean_window.filtered(loss)
        return loss

    def _tokens_of(self, inputs) -> torch.Tensor | int:
        ids = inputs[getattr(self.model, "main_input_name", "input_ids")]
        mask = inputs.get("attention_mask")
        if self.count_tokens == "non_padding" and mask is not None:
            return mask.sum()
        if self.count_tokens == "non_padding" and SEQUENCE_LENGTHS in inputs:
            return inputs[SEQUENCE_LENGTHS].sum()
        return ids.numel()  # "all", or a batch without padding (its mask was dropped)

    def floating_point_ops(self, inputs) -> int:
        """Trainer's count (6 x non-embedding parameters x input tokens), the parameters
        counted once rather than every step."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._flops_per_token is None:
            self._flops_per_token = 6 * self.model.num_parameters(exclude_embeddings=True)
        return self._flops_per_token * inputs[main].numel()

    # -- reading the window at logging steps -------------------------------------------------
    def flush_step_counters(self) -> int:
        """Adds the window's tokens to state.num_input_tokens_seen (a read of the device: at
        logging, saving and the end only); returns the window's non-finite losses."""
        tokens, nonfinite = self._lean_window.read(self.accelerator)
        self.state.num_input_tokens_seen += tokens
        return nonfinite

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's log line, with the tokens seen (and their rate on the closing line) that
        Trainer adds when it counts them itself."""
        nonfinite = self.flush_step_counters()
        logs = dict(logs)
        if nonfinite:
            logs["nonfinite_losses"] = nonfinite
        if self.count_tokens != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                session = self.state.num_input_tokens_seen - getattr(
                    self, "_initial_num_input_tokens_seen", 0)
                logs.update(speed_metrics("train", start_time, num_tokens=session))
        super().log(logs, start_time)

    def train(self, *args, **kwargs):
        # Last among the callbacks, so that a stop or save that another callback decides at a
        # step's end still finds the counters flushed into the state it saves; the last-step
        # log just before, so that it sees every stop decided at the step's end.
        put_last(self, self._last_step_callback)
        put_last(self, self._flush_callback)
        return super().train(*args, **kwargs)

    def evaluation_loop(self, *args, **kwargs):
        """Evaluation keeps Trainer's own NaN/Inf filter (on host arrays: no sync)."""
        self.args.logging_nan_inf_filter = self.filter_nonfinite
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self.args.logging_nan_inf_filter = False


class _DeviceWindow:
    """Sums on the device between two readings: input tokens, finite losses and their count,
    non-finite losses."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tokens: torch.Tensor | int = 0
        self.loss_sum: torch.Tensor | None = None
        self.finite = self.nonfinite = None

    def add_tokens(self, count: torch.Tensor | int) -> None:
        self.tokens = self.tokens + count

    def filtered(self, loss: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(loss)
        if self.loss_sum is None:
            self.loss_sum = torch.zeros_like(loss)
            self.finite = torch.zeros((), dtype=torch.int64, device=loss.device)
            self.nonfinite = torch.zeros((), dtype=torch.int64, device=loss.device)
        kept = torch.where(finite, loss, torch.zeros_like(loss))
        self.loss_sum = self.loss_sum + kept
        self.finite = self.finite + finite
        self.nonfinite = self.nonfinite + ~finite
        mean = self.loss_sum / self.finite.clamp(min=1)
        return torch.where(finite, loss, mean)

    def read(self, accelerator) -> tuple[int, int]:
        """(tokens, non-finite losses) of the window over all processes; opens the next."""
        nonfinite = 0 if self.nonfinite is None else self.nonfinite
        values = torch.stack([torch.as_tensor(value, dtype=torch.int64, device=accelerator.device)
                              for value in (self.tokens, nonfinite)])
        if accelerator.num_processes > 1:
            values = accelerator.reduce(values, reduction="sum")
        tokens, nonfinite = (int(value) for value in values.tolist())
        self.reset()
        return tokens, nonfinite


class LogLastStep(TrainerCallback):
    """Makes the step that ends training a logging step, so that the last training line (and
    with it the final losses) covers the steps up to the end: at max_steps, or where another
    callback stops the run at a step's end (time budget, train_fraction, preemption), or, for
    a stop decided after the step's log (early stopping, at an evaluation), at the epoch's end
    that follows. Keeps the window of the last training line: (first step, last step)."""

    def __init__(self):
        self.window: tuple[int, int] | None = None
        self._last_logged = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_logged = state.global_step  # Trainer's window starts here on a resume too
        return control

    def on_step_end(self, args, state, control, **kwargs):
        return self._log_if_ending(args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self._log_if_ending(args, state, control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:  # a training line (not evaluation, held-out or closing)
            self.window = (self._last_logged + 1, state.global_step)
            self._last_logged = state.global_step
        return control

    @staticmethod
    def _log_if_ending(args, state, control):
        ending = control.should_training_stop or state.global_step >= state.max_steps
        if ending and args.logging_strategy != IntervalStrategy.NO:
            control.should_log = True
        return control


class FlushAtLoggingSteps(TrainerCallback):
    """Flushes the counters into Trainer's state before a checkpoint is saved and when
    training ends, so that a resumed run counts on from the right number."""

    def __init__(self, trainer: LeanStepTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and not control.should_log:
            self.trainer.flush_step_counters()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer.flush_step_counters()
        return control

"""The one Trainer bertkit trains with, and the steps it changes in transformers' Trainer:
batches in a few static shapes and when a finetune is compiled (the first section), a step
without host syncs between logging steps, attention masks that cost the host nothing,
training batches grouped by the precomputed length with evaluation in dataset order, and
evaluation that scores whole examples; last, the trainer internals (every edit of a built
Trainer beyond its public methods). Each section below says why Trainer's own way did not
do.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from huggingface_hub import ModelCard
from omegaconf import DictConfig
from torch.utils.data import Sampler, SequentialSampler
from transformers import BertModel, Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import (
    EvalLoopOutput,
    IntervalStrategy,
    TrainOutput,
    speed_metrics,
)

from bertkit.data.atomic_files import follow_umask, write_text_atomic
from bertkit.errors import BertkitError
from bertkit.training.model_card import CARD_FILE

logger = logging.getLogger(__name__)


# ================================================================================================
# Static shapes, and when a finetune is compiled.
#
# Compiled (trainer.torch_compile) with CUDA graphs (trainer.torch_compile_mode=reduce-overhead),
# a step replays as one launch: the only measured way a GPU finetune leaves the host bound
# (cards/gpu.md: 3.18x the plain way on SST-2). But every new input shape costs a new
# graph (about 20 s cold on an H100), so batches come in a few shapes only:
#
# - widths: a multiple of bucket_width (padding_multiple), a few up to task.max_seq_length;
# - rows: the last, partial batch of an epoch or of an evaluation set is filled up to the batch
#   size with copies of its first row whose labels weigh nothing (PaddedRows: -100, a position past
#   the window for SQuAD, NaN with a NaN-ignoring loss for regression). The model's loss is a mean
#   over the labels it does not ignore, so the loss and the gradients are the unpadded batch's; the
#   padded rows' predictions are cut off in the step, before evaluation reads them;
# - modes: one graph per width for training, one per width for evaluation (dropout off).
#
# Where static shapes pay (static_shapes_pay): on a GPU, or compiled. On a CPU without compile
# compute is the cost and shapes are free, so batches stay padded to their longest.
#
# Whether to compile (trainer.torch_compile=auto): on a GPU, for runs long enough to pay the
# compile back (compile_min_steps); Dynamo, AOTAutograd and Inductor keep their caches under
# cache_dir/torch_compile, shared by every job of a sweep, so the first job pays the compile and
# the later ones load it (docs/speed.md, "Compiled finetuning").

# The key a padded batch carries its number of real rows under (taken out before the model).
REAL_ROWS = "bertkit_real_rows"
# What the loss functions of transformers' classification and token heads ignore.
IGNORE_INDEX = -100
# A SQuAD start or end position past the window: the QA heads clamp positions to the window's
# length and ignore that index.
PAST_WINDOW = "past_window"


@dataclass
class PaddedRows:
    """How a family's padded rows weigh nothing: each label key's fill value (IGNORE_INDEX,
    PAST_WINDOW, or NaN for a float label), and the loss that ignores it where the model's own
    does not (regression: MSE has no ignore index)."""

    labels: dict[str, float | int | str] = field(
        default_factory=lambda: {"labels": IGNORE_INDEX})
    loss: Callable | None = None


def nan_ignoring_mse(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """The regression head's MSE (transformers' MSELoss over logits.squeeze()) over the rows
    whose label is not NaN: without a host sync, and the same shape for every batch."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    predicted = logits.reshape(labels.shape)
    real = ~torch.isnan(labels)
    squared = torch.where(real, predicted - torch.nan_to_num(labels), 0.0) ** 2
    return squared.sum() / real.sum()


class FixedRows:
    """A collator whose batches all have `rows` rows: a short one is filled with copies of its
    first row, their labels set to what the loss ignores (PaddedRows), and the number of real
    rows under REAL_ROWS."""

    def __init__(self, collator, rows: int, padded: PaddedRows):
        self.collator, self.rows, self.padded = collator, rows, padded

    def __call__(self, features):
        batch = self.collator(features)
        real = len(features)
        if real >= self.rows:
            return batch
        for key, value in list(batch.items()):
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            filler = value[:1].expand(self.rows - real, *value.shape[1:]).clone()
            if key in self.padded.labels:
                fill = self.padded.labels[key]
                if fill == PAST_WINDOW:
                    fill = batch["input_ids"].shape[-1]
                filler.fill_(fill)
            batch[key] = torch.cat([value, filler])
        batch[REAL_ROWS] = real
        return batch


def first_rows(values, rows: int):
    """Tensors (nested in tuples, lists or dicts) cut to their first `rows` rows."""
    if isinstance(values, torch.Tensor):
        return values[:rows] if values.dim() else values
    if isinstance(values, (tuple, list)):
        return type(values)(first_rows(value, rows) for value in values)
    if isinstance(values, dict):
        return {key: first_rows(value, rows) for key, value in values.items()}
    return values


def use_padded_rows(trainer, padded: PaddedRows) -> None:
    """Every batch of `trainer` (training and evaluation) at its full number of rows."""
    trainer.padded_rows = padded
    if padded.loss is not None:
        trainer.compute_loss_func = padded.loss


# -- where static shapes pay, and whether to compile -------------------------------------------

# trainer.torch_compile_mode's choices: torch.compile's modes (torch._inductor.list_mode_options;
# "lite" is left out, newer than the torch 2.11 the GPU card ran). reduce-overhead records CUDA
# graphs; max-autotune also times Triton/ATen kernels per GEMM shape (minutes of compile) and
# records CUDA graphs; max-autotune-no-cudagraphs searches without them.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

def compile_wanted(cfg: DictConfig) -> bool:
    """trainer.torch_compile=auto: on a GPU (whether the run is long enough to pay the compile
    back is decided once its data is known: decide_compile); true/false as given; a
    trainer.torch_compile_mode asks for compile (as TrainingArguments reads it)."""
    setting = cfg.trainer.torch_compile
    if cfg.trainer.torch_compile_mode:
        return True
    return torch.cuda.is_available() if setting == "auto" else bool(setting)


def static_shapes_pay(cfg: DictConfig) -> bool:
    """Batches of a few fixed shapes (pretraining's phase lengths, finetuning's buckets and full
    rows) where they pay: on a GPU, or compiled (one graph per shape). On a CPU without compile,
    where compute is the cost and shapes are free, each batch is padded to its longest sequence
    unless buckets_on_cpu=true."""
    return torch.cuda.is_available() or compile_wanted(cfg) or cfg.buckets_on_cpu


def padding_multiple(cfg: DictConfig, mixed_precision: bool) -> int | None:
    """What finetuning batches are padded to a multiple of: bucket_width where static shapes
    pay (static_shapes_pay), and pad_to_multiple_of under mixed precision (tensor cores);
    None for 1."""
    multiple = cfg.bucket_width
    if not static_shapes_pay(cfg):
        multiple = 1
    if mixed_precision and cfg.pad_to_multiple_of:
        multiple = math.lcm(multiple, int(cfg.pad_to_multiple_of))
    return multiple if multiple > 1 else None


def planned_steps(args, train_rows: int, processes: int = 1) -> int:
    """The optimizer steps the run's schedule has (trainer.max_steps, or its epochs), counted
    as Trainer counts them: each process's batches in accumulations, a last partial one
    included."""
    if args.max_steps > 0:
        return args.max_steps
    batches = math.ceil(math.ceil(train_rows / max(processes, 1))
                        / args.per_device_train_batch_size)
    return math.ceil(max(math.ceil(batches / args.gradient_accumulation_steps), 1)
                     * args.num_train_epochs)


def compile_arguments(args, on: bool, mode: str | None) -> None:
    """TrainingArguments compiled (backend inductor, `mode`) or not, set after they were built
    (TrainingArguments settles its compile fields in __post_init__)."""
    args.torch_compile = on
    args.torch_compile_backend = (args.torch_compile_backend or "inductor") if on else None
    args.torch_compile_mode = mode if on else None


def decide_compile(cfg: DictConfig, args, steps: int) -> None:
    """trainer.torch_compile=auto, once the run's length is known: compiled with CUDA graphs on
    a GPU when the run has at least compile_min_steps optimizer steps (shorter, the compile
    costs more than it saves: docs/speed.md), eager otherwise and on a CPU. A compiled run on a
    GPU records CUDA graphs unless trainer.torch_compile_mode says otherwise."""
    mode = cfg.trainer.torch_compile_mode
    on = compile_wanted(cfg)
    if cfg.trainer.torch_compile == "auto" and mode is None:
        least = cfg.compile_min_steps
        on = on and steps >= least
        logger.info("trainer.torch_compile=auto: %s (%d optimizer steps, compile_min_steps=%d,"
                    " %s)", "compiled" if on else "eager", steps, least,
                    "GPU" if torch.cuda.is_available() else "CPU")
    if on and mode is None and torch.cuda.is_available():
        mode = "reduce-overhead"
    compile_arguments(args, on, mode)


def prepare_compile(cache_dir: str, graphs: int = 0) -> None:
    """Dynamo set up for a run of at most `graphs` static graphs per compiled function: a
    recompile limit that keeps every bucket compiled instead of falling back to eager, the
    graphs of an earlier run in this process (a sweep's jobs under Hydra's basic launcher)
    forgotten, and the compile caches under cache_dir/torch_compile (a user's
    TORCHINDUCTOR_CACHE_DIR wins). (No dynamic-shape graph at a second shape: BertkitTrainer
    turns Dynamo's automatic dynamic shapes off.)"""
    import torch._dynamo
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)

    # Inductor writes its default folder into the environment when it first looks (at import
    # of some libraries): that one is not the user's choice.
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        cache = Path(cache_dir).resolve() / "torch_compile"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))


def compile_graphs(max_seq_length: int, bucket_width: int) -> int:
    """Graphs a finetune compiles at most: one per bucket width, for training and evaluation."""
    return 2 * math.ceil(max_seq_length / max(bucket_width, 1))


class CompileRecord:
    """What compiling cost a run, for metrics.json's details: the graphs Dynamo made, its graph
    breaks, and the seconds it spent compiling, forward and backward (Dynamo's own timers, which
    prepare_compile's reset started from zero)."""

    def __init__(self):
        self.start = self._counts()

    @staticmethod
    def _counts() -> tuple[int, int]:
        from torch._dynamo.utils import counters

        return (int(counters["stats"]["unique_graphs"]),
                int(sum(counters["graph_break"].values())))

    def facts(self) -> dict:
        from torch._dynamo.utils import calculate_time_spent

        graphs, breaks = (now - then for now, then in zip(self._counts(), self.start, strict=True))
        return {"graphs": graphs, "graph_breaks": breaks,
                "seconds": round(float(calculate_time_spent().get("total_wall_time", 0.0)), 2)}


# ================================================================================================
# Attention masks that cost the host nothing.
#
# transformers turns a 2D padding mask into the attention kernel's 4D mask inside the model, and
# before SDPA it asks whether the mask is all ones (`padding_mask.all()`, a host sync on a GPU) so
# that an unpadded batch can go without one. Both answers are cheaper elsewhere: the collator's
# batch is still on the host, where "is anything padded?" is free, so a batch without padding
# goes to the model without a mask; and a padded batch's mask is expanded on the device into the
# 4D mask transformers would build (its documented input: a 4D mask is used as given), so the
# model never asks. Results are unchanged: the same mask reaches the same kernel.

MASK = "attention_mask"
# A padding-free batch's key (bertkit.pretraining.batches): each sequence's length, 0 in an
# unused slot; such a batch has no attention mask, its real tokens are these lengths' sum.
SEQUENCE_LENGTHS = "sequence_lengths"
# The kernels whose 4D mask is built here; FlashAttention-2 and flex attention take the 2D
# mask (flash unpads with it), and keep transformers' own path.
FOUR_D = ("sdpa", "eager")


class WithoutFullMasks:
    """A collator whose batches carry no attention mask when nothing in them is padded."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        batch = self.collator(features)
        mask = batch.get(MASK) if hasattr(batch, "get") else None
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and bool(mask.all()):
            del batch[MASK]
        return batch


def without_full_masks(collator):
    return collator if isinstance(collator, WithoutFullMasks) else WithoutFullMasks(collator)


def four_d_mask(mask: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """transformers' bidirectional mask for `implementation`: [batch, 1, query, key], True (or
    0.0 for eager's additive mask) where the key is a real token."""
    length = mask.shape[-1]
    keep = mask[:, None, None, :].bool().expand(mask.shape[0], 1, length, length)
    if implementation == "sdpa":
        return keep
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def _expand_mask(module: BertModel, args, kwargs):
    positional = MASK not in kwargs and len(args) > 1
    mask = args[1] if positional else kwargs.get(MASK)
    implementation = module.config._attn_implementation
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or implementation not in FOUR_D:
        return None
    mask = four_d_mask(mask, implementation, module.get_input_embeddings().weight.dtype)
    if positional:
        return (args[0], mask, *args[2:]), kwargs
    return args, {**kwargs, MASK: mask}


def attach_padding_masks(model: torch.nn.Module) -> None:
    """Every BertModel inside `model` (task heads, peft wrappers) builds its 4D mask here."""
    for module in model.modules():
        if isinstance(module, BertModel) and not getattr(module, "_bertkit_masks", False):
            module.register_forward_pre_hook(_expand_mask, with_kwargs=True)
            module._bertkit_masks = True


# ================================================================================================
# Trainer's step without host syncs between logging steps, for every bertkit trainer.
#
# On a GPU, anything that reads a device value on the host (`.item()`, `bool(tensor)`, a
# data-dependent shape) stops Python until the GPU has run every kernel queued before it, so the
# next step's kernels start late. Counted by `make bench-step`, Trainer's own step
# made three or four per step; each is moved here to the device, or to logging steps only:
#
# - the NaN/Inf filter of the logged loss (trainer.logging_nan_inf_filter): Trainer asks
#   `torch.isnan(loss) or torch.isinf(loss)` every micro-batch. Here a non-finite loss is
#   replaced on the device by the mean of the window's finite ones (Trainer adds the mean of the
#   window so far: the same idea) and counted; the count is logged as `nonfinite_losses` when not
#   zero. Evaluation keeps Trainer's own filter (on host arrays, no sync).
# - tokens seen (trainer.include_num_input_tokens_seen): Trainer gathers and `.item()`s the count
#   every step; here it is summed on the device and added to state.num_input_tokens_seen at
#   logging, saving and the end of training (one collective each time under DDP).
# - the FLOPs Trainer logs (floating_point_ops): Trainer walks the model's parameters in Python
#   every step; here the per-token count is taken once (the same 6 x non-embedding parameters x
#   tokens).
# - the attention mask (attach_padding_masks, above): transformers asks the GPU whether a
#   padding mask is all ones before SDPA; a batch without padding goes without a mask (unless
#   compiled: one graph per shape), and a padded one as the 4D mask transformers would build,
#   which it uses as given.
#
# The last step is a logging step too (LogLastStep): Trainer logs at every logging_steps only,
# so a run shorter than logging_steps (trainer.max_steps=3, logging_steps=100) ended on step 1's
# line, and the final losses printed and sent to W&B were step 1's.
#
# Trainer's own flags are turned off on the arguments this trainer holds (their values are kept
# and acted on here), so the rest of Trainer's loop is unchanged.

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

    def __init__(self, trainer: BertkitTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and not control.should_log:
            self.trainer.flush_step_counters()
        if control.should_save and self.trainer.accelerator.num_processes > 1:
            self.trainer.gather_running_totals()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer.flush_step_counters()
        return control


class CarriedTotals(TrainerCallback, ExportableState):
    """The sums a train() call keeps for itself (Trainer's training-loss sums; pretraining's
    log window and padding counts: BertkitTrainer.running_totals), saved with each checkpoint
    in its trainer_state.json (stateful_callbacks) and put back when a run resumes from it, so
    that a resumed run logs and records what the uninterrupted run does: its training loss is
    the mean over all its steps, not over the last session's, and the log line whose window
    a resume split is the same line. (Trainer restores an ExportableState only under
    restore_callback_states_from_checkpoint, and builds a new one then: this one reads its
    entry itself.)"""

    def __init__(self, trainer: BertkitTrainer | None = None):
        self.trainer = trainer
        self.whole_run = True  # False: resumed from a checkpoint that carried no sums

    def state(self) -> dict:
        totals = {} if self.trainer is None else self.trainer.running_totals()
        return {"args": {}, "attributes": {"totals": totals}}

    def on_train_begin(self, args, state, control, **kwargs):
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        totals = saved.get("attributes", {}).get("totals") if isinstance(saved, dict) else None
        # Trainer updates this entry at each save, and fails on a resumed state without it.
        state.stateful_callbacks.setdefault(name, self.state())
        self.whole_run = state.global_step == 0 or bool(totals)
        if state.global_step > 0 and totals and self.trainer is not None:
            self.trainer.restore_running_totals(totals)
        return control


def push_model(trainer: Trainer, card: ModelCard | None, model_dir: Path):
    """The end of a run with trainer.push_to_hub=true: the model and its card to the Hub."""
    if not isinstance(trainer, BertkitTrainer):
        raise TypeError(f"{type(trainer).__name__} is not a BertkitTrainer: its push would upload "
                        f"Trainer's own card and push on every save_model")
    return trainer.push_with_card(None if card is None else str(card), model_dir)


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """Each epoch's length-grouped order drawn from seed + epoch (Trainer calls set_epoch), as
    accelerate's SeedableRandomSampler does for Trainer's default sampler. With the global
    RNG instead, a run resumed in a later epoch would draw another order than the
    uninterrupted run: the RNG state at that epoch's start is not in the checkpoint."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator())
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


# ================================================================================================
# The loss on N processes, as on one.
#
# Trainer scales the loss for a model whose forward takes **kwargs (every BertFor* head, peft's
# wrappers) as if the model returned a sum divided by `num_items_in_batch` (the items of the
# whole batch, over gradient-accumulation steps and processes): it multiplies the loss by the
# number of processes (DDP averages the gradients) and does not divide it by the accumulation
# steps. bertkit's heads return a mean over their own micro-batch's items, so under torchrun
# every loss, gradient norm (and clipping) and evaluation loss came out N times the one-process
# run's (the Hugging Face example scripts share the defect). Here the scaling follows what the
# loss is: each micro-batch's mean is weighted by its share of the items of the whole batch,
#     loss x items in this micro-batch x processes / items in the whole batch,
# so that DDP's average over processes (and the sum over accumulation steps) gives the mean over
# every item of the batch: a one-process run's loss and gradients at the same global batch. The
# items are what the loss averages over: the labels it does not ignore (loss_items below, the
# family's PaddedRows: a row of a classification, regression, multiple-choice or span batch, a
# labelled token of a tagging batch). One process without accumulation weighs 1.0 exactly, so its
# results are unchanged to the bit. Evaluation losses are the model's own means.


def loss_items(batch: dict, labels: PaddedRows) -> torch.Tensor | None:
    """How many items a micro-batch's loss averages over: the entries of its first label key
    (PaddedRows.labels) that the loss does not ignore; None for a batch without labels."""
    for key, ignored in labels.labels.items():
        values = batch.get(key)
        if not isinstance(values, torch.Tensor):
            continue
        if ignored == PAST_WINDOW:  # span heads clamp positions to the window, ignore its end
            return (values.clamp(min=0) < batch["input_ids"].shape[-1]).sum()
        if isinstance(ignored, float) and ignored != ignored:  # NaN: regression's padded rows
            return (~torch.isnan(values)).sum()
        return (values != ignored).sum()
    return None


# ================================================================================================
# The one Trainer. Besides the lean step and the loss's scaling (above) it changes three things
# of Trainer's:
#
# - batches: at full rows where static shapes pay (the first section, above: the
#   dataloaders built with FixedRows, REAL_ROWS taken out before the model, the padded rows'
#   predictions cut off after it); training batches grouped by length from the precomputed
#   `length` column, and evaluation in dataset order. Trainer (transformers 5) drops `length`
#   before it builds the sampler, so it re-measures every example, and it applies length
#   grouping to evaluation too, which shuffles the order of predictions that prediction files
#   rely on.
# - evaluation, with a family's `scorer`: Trainer's compute_metrics sees one prediction per
#   model input, but a SQuAD answer comes from all the windows of a question, cut from the
#   passage text, and an NER tag is a word's, from its first sub-token, across the features of
#   a long sentence. evaluate() then runs Trainer's own evaluation loop, hands its predictions
#   to the scorer with the evaluated dataset, and returns the scores as eval_* metrics, so that
#   checkpoint selection (metric_for_best_model), early stopping and loggers see the numbers
#   metrics.json reports. A dict of evaluation datasets is scored one by one, with the split in
#   the metric names.
# - the Hub push: bertkit pushes once, at the end of the run (push_model); Trainer's save_model
#   would push by itself when the job saves <run dir>/model, before metrics.json and the card
#   exist, so a save here never pushes; and the README.md that push_to_hub uploads is bertkit's
#   card (bertkit.training.model_card), not Trainer's draft.

# (the evaluation loop's output, the evaluated dataset) -> {metric: value}
Scorer = Callable[[EvalLoopOutput, datasets.Dataset], dict[str, float]]


def tied_weight_names(model) -> set[str]:
    """The parameters of `model` that are tied to another (transformers' all_tied_weights_keys,
    {tied: source}), saved once in a checkpoint under the source's name."""
    return set(getattr(model, "all_tied_weights_keys", None) or {})


class BertkitTrainer(Trainer):
    """Trainer with the step's host syncs moved to logging steps, batches at full rows where
    static shapes pay, length-grouped training batches, evaluation in dataset order and scored
    by the family's scorer, and a Hub push that carries bertkit's card (the comments above)."""

    padded_rows: PaddedRows | None = None
    # What the model's loss averages over (the family's labels and what they ignore; the
    # finetune job sets the family's): classification's `labels`, -100 ignored, by default.
    loss_labels: PaddedRows = PaddedRows()
    _eager_predictions = False  # inside predicting_eagerly
    _compiled_for_evaluation = None  # the model compiled for evaluation (_wrap_model)

    hub_card: str | None = None  # set by push_with_card

    def __init__(self, *args, scorer: Scorer | None = None, **kwargs):
        """scorer: how evaluation scores whole examples (a family's answers or entities);
        None: Trainer's own evaluation, with the family's compute_metrics."""
        super().__init__(*args, **kwargs)
        self.scorer = scorer
        settings = getattr(self.args, "_bertkit_lean_settings", None)
        if settings is None:  # the user's settings, taken once per arguments object
            tokens = self.args.include_num_input_tokens_seen
            tokens = {True: "all", False: "no"}.get(tokens, tokens)
            settings = (bool(self.args.logging_nan_inf_filter), str(tokens))
            self.args._bertkit_lean_settings = settings
            self.args.logging_nan_inf_filter = False
            self.args.include_num_input_tokens_seen = "no"
        self.filter_nonfinite, self.count_tokens = settings
        # The loss is a mean over the micro-batch's items: no num_items_in_batch for forward,
        # no scaling by Trainer; compute_loss weighs it (the comment above loss_items).
        self.model_accepts_loss_kwargs = False
        self.loss_is_scaled_for_ga = True
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
        self._carried = CarriedTotals(self)
        self.add_callback(self._carried)

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
        if "train_loss" in logs and (loss := self.whole_run_loss()) is not None:
            logs["train_loss"] = loss  # the closing line: over every step (CarriedTotals)
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
        """Trainer's train, its training loss over every step of the run (CarriedTotals)."""
        # Last among the callbacks, so that a stop or save that another callback decides at a
        # step's end still finds the counters flushed into the state it saves; the last-step
        # log just before, so that it sees every stop decided at the step's end.
        put_last(self, self._last_step_callback)
        put_last(self, self._flush_callback)
        output = super().train(*args, **kwargs)
        loss = self.whole_run_loss()
        if loss is None:
            return output
        return TrainOutput(output.global_step, loss, {**output.metrics, "train_loss": loss})

    # -- loading a checkpoint back ---------------------------------------------------------
    def _issue_warnings_after_load(self, load_result) -> None:
        """Trainer's warning of missing keys, without the tied weights: a checkpoint saves a
        tied weight once (BertForPreTraining's MLM decoder is the word embeddings), so a
        resume reported ['cls.predictions.decoder.weight', ...] as missing, harmless and
        alarming; loading the embeddings has filled them. A key missing for real is still
        reported. (Trainer's private hook after every load of a checkpoint's weights: pinned
        by tests/test_trainer_internals.py.)"""
        tied = tied_weight_names(self.model)
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    # -- what a resumed run carries on (CarriedTotals) ---------------------------------------
    def running_totals(self) -> dict:
        """The sums this train() call keeps that the uninterrupted run would still hold at
        this step (a subclass adds its own); saved in each checkpoint. A read of the device,
        at saves only."""
        return {"loss": loss_sums(self)}

    def restore_running_totals(self, totals: dict) -> None:
        """Puts back what running_totals saved, as train() begins from that checkpoint."""
        restore_loss_sums(self, totals["loss"])

    def gather_running_totals(self) -> None:
        """Under DDP, before a save (every process): the main process saves the checkpoint's
        totals alone, so it is made to hold what the log line would read from all of them.
        The training loss's window is logged as its mean over processes: each process holds
        that mean from here on (the line it logs is unchanged), and a resume puts it back on
        every process."""
        average_loss_window(self)

    def whole_run_loss(self) -> float | None:
        """The mean training loss over every step of the run, resumes included (Trainer's own
        is the last session's sum over its steps); None when the run resumed from a
        checkpoint that carried no sums."""
        if not self._carried.whole_run:
            return None
        return drained_loss_sum(self) / max(self.state.global_step, 1)

    def evaluation_loop(self, *args, **kwargs):
        """Evaluation keeps Trainer's own NaN/Inf filter (on host arrays: no sync)."""
        self.args.logging_nan_inf_filter = self.filter_nonfinite
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self.args.logging_nan_inf_filter = False

    # -- batches: fixed rows, length grouping, evaluation order ----------------------------
    @contextmanager
    def _fixed_rows(self, rows: int):
        if self.padded_rows is None or self.data_collator is None:
            yield
            return
        collator = self.data_collator
        self.data_collator = FixedRows(collator, rows, self.padded_rows)
        try:
            yield
        finally:
            self.data_collator = collator

    def get_train_dataloader(self):
        with self._fixed_rows(self._train_batch_size):
            return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset=None):
        with self._fixed_rows(self.args.eval_batch_size):
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        with self._fixed_rows(self.args.eval_batch_size):
            return super().get_test_dataloader(test_dataset)

    def _items_of(self, batch: dict) -> torch.Tensor | int:
        """What a micro-batch's loss averages over (loss_items), its rows for a batch whose
        labels the family does not name."""
        items = loss_items(batch, self.loss_labels)
        return batch["input_ids"].shape[0] if items is None else items

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device):
        """The items of the whole batch in training (its micro-batches on every process),
        counted as the loss counts them; None in evaluation, whose losses are not weighed."""
        if not self.model.training or not batch_samples:
            return None
        total = torch.as_tensor(sum(self._items_of(batch) for batch in batch_samples),
                                device=device)
        if self.accelerator.num_processes > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        return total

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs.pop(REAL_ROWS, None)
        items = None if num_items_in_batch is None else self._items_of(inputs)
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True)
        if items is not None:  # training: the micro-batch's share of the whole batch
            loss = loss * (items * self.accelerator.num_processes / num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        rows = inputs.pop(REAL_ROWS, None)
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only,
                                                       ignore_keys)
        if rows is None:
            return loss, logits, labels
        return loss, first_rows(logits, rows), first_rows(labels, rows)

    @contextmanager
    def predicting_eagerly(self):
        """Predictions that happen once, on data without labels (GLUE's leaderboard files), run
        the model uncompiled: a graph of their own (no loss) would cost more than it saves."""
        self._eager_predictions = True
        try:
            yield
        finally:
            self._eager_predictions = False

    def _wrap_model(self, model, training=True, dataloader=None):
        """Evaluation after training runs compiled too: Trainer compiles the model it trains
        (accelerate's prepare) but evaluates the plain one once it has trained."""
        wrapped = super()._wrap_model(model, training, dataloader)
        if training or not self.args.torch_compile or wrapped is not self.model \
                or not self.accelerator._models or self._eager_predictions:
            return wrapped
        compiled = self._compiled_for_evaluation
        if compiled is None or compiled._orig_mod is not self.model:
            compiled = torch.compile(self.model,
                                     **self.accelerator.state.dynamo_plugin.to_kwargs())
            self._compiled_for_evaluation = compiled
        return compiled

    def _get_train_sampler(self, train_dataset=None) -> Sampler | None:
        column = self.args.length_column_name
        if (self.args.train_sampling_strategy == "group_by_length"
                and column in getattr(self.train_dataset, "column_names", [])):
            # Grouped by the whole batch (every process's rows of every accumulation step):
            # accelerate hands each process consecutive slices of one order, so a batch holds
            # the examples of a one-process run's at the same global batch.
            return EpochSeededLengthGroupedSampler(
                self.args.train_batch_size * self.args.gradient_accumulation_steps
                * self.args.world_size,
                # [:] makes a list: datasets >= 4 returns a lazy Column whose item-by-item
                # reads cost about 11 s an epoch on SST-2.
                lengths=self.train_dataset[column][:],
                seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            )
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset) -> Sampler | None:
        # None lets accelerate shard in order across processes; one process reads in order.
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    # -- evaluation scored by the family's scorer ------------------------------------------
    def predict_loop(self, dataset: datasets.Dataset, metric_key_prefix: str = "eval",
                     ignore_keys=None) -> EvalLoopOutput:
        dataloader = self.get_eval_dataloader(dataset)
        return self.evaluation_loop(dataloader, description="Evaluation",
                                    prediction_loss_only=False, ignore_keys=ignore_keys,
                                    metric_key_prefix=metric_key_prefix)

    def evaluate(self, eval_dataset=None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        if self.scorer is None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, table in dataset.items():
                metrics.update(self.evaluate(table, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        started = time.perf_counter()
        output = self.predict_loop(dataset, metric_key_prefix, ignore_keys)
        scoring = time.perf_counter()
        scores = self.scorer(output, dataset)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(output.metrics)
        metrics[f"{metric_key_prefix}_scoring_seconds"] = time.perf_counter() - scoring
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - started
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control,
                                                         metrics)
        return metrics

    # -- the Hub push ----------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call=True)
        if self.args.should_save:  # checkpoints come here too (Trainer._save_checkpoint)
            follow_umask(output_dir or self.args.output_dir)

    def create_model_card(self, **kwargs) -> None:
        if self.hub_card is None:  # model_card.enabled=false: Trainer's own card
            return super().create_model_card(**kwargs)
        if self.is_world_process_zero():
            write_text_atomic(Path(self.args.output_dir) / CARD_FILE, self.hub_card)

    def init_hf_repo(self, token: str | None = None, **kwargs) -> None:
        # Network, login and permission errors come in many types (httpx's, OSError, the
        # Hub's HTTP errors): whichever it is, one message naming the settings. **kwargs:
        # whatever this transformers passes (`private` in newer releases).
        try:
            super().init_hf_repo(token=token, **kwargs)
        except Exception as err:
            raise BertkitError(
                f"trainer.push_to_hub=true: cannot create or reach the Hub repository "
                f"trainer.hub_model_id={self.args.hub_model_id} "
                f"({type(err).__name__}: {err}); log in with `hf auth login` (or set "
                f"HF_TOKEN), or set trainer.push_to_hub=false") from err

    def push_with_card(self, card: str | None, model_dir: Path):
        """Trainer.push_to_hub (the model saved into args.output_dir and that folder uploaded)
        with `card` as its README.md; every process calls it (a sharded model saves from
        all)."""
        self.hub_card = card
        try:
            return self.push_to_hub(commit_message="bertkit: model and card at the end of "
                                                   "training")
        except Exception as err:  # as in init_hf_repo: any failure of the upload
            repo = self.hub_model_id or self.args.hub_model_id
            raise BertkitError(
                f"trainer.push_to_hub=true: pushing to {repo} failed "
                f"({type(err).__name__}: {err}); the model and its card are saved in "
                f"{model_dir}: upload them with `hf upload {repo} {model_dir}`") from err

# ================================================================================================
# The trainer internals: every edit bertkit makes to a built transformers.Trainer beyond its
# public methods, in one place. Trainer has no public way to put a callback before the reporting
# ones, to hand it a layer-wise optimizer after the model it holds was prepared, or to swap in
# LoRA's merged model for the final evaluation; each edit below is pinned by
# tests/test_trainer_internals.py against the installed transformers, so a release that moves
# one fails that test, not a user's run. (Trainer's private sampler hooks,
# _get_train_sampler/_get_eval_sampler, are overridden in BertkitTrainer above and
# bertkit.pretraining.trainer and pinned there too; _wrap_model, to evaluate the compiled model,
# in BertkitTrainer too, pinned by tests/training/test_compiled_graphs.py's count of
# evaluation graphs.)

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
# (CarriedTotals, above).

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

"""Static shapes, and when a finetune is compiled.

Compiled (trainer.torch_compile) with CUDA graphs (trainer.torch_compile_mode=reduce-overhead),
a step replays as one launch: the only measured way a GPU finetune leaves the host bound
(cards/gpu.md: 3.18x the plain way on SST-2). But every new input shape costs a new
graph (about 20 s cold on an H100), so batches come in a few shapes only:

- widths: a multiple of bucket_width (padding_multiple), a few up to task.max_seq_length;
- rows: the last, partial batch of an epoch or of an evaluation set is filled up to the batch
  size with copies of its first row whose labels weigh nothing (PaddedRows: -100, a position past
  the window for SQuAD, NaN with a NaN-ignoring loss for regression). The model's loss is a mean
  over the labels it does not ignore, so the loss and the gradients are the unpadded batch's; the
  padded rows' predictions are cut off in the step, before evaluation reads them;
- modes: one graph per width for training, one per width for evaluation (dropout off).

Where static shapes pay (static_shapes_pay): on a GPU, or compiled. On a CPU without compile
compute is the cost and shapes are free, so batches stay padded to their longest.

Whether to compile (trainer.torch_compile=auto): on a GPU, for runs long enough to pay the
compile back (compile_min_steps); Dynamo, AOTAutograd and Inductor keep their caches under
cache_dir/torch_compile, shared by every job of a sweep, so the first job pays the compile and
the later ones load it (docs/speed.md, "Compiled finetuning").
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig

logger = logging.getLogger(__name__)

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

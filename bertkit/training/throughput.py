"""Throughput of every training run, measured beside Trainer without forking its loop.

Real (non-padding) tokens/s, samples/s, the share of real tokens among the positions fed,
training FLOPs (bertkit.training.flops: matmuls on real tokens), MFU = FLOPs / (seconds x dense
peak x processes) where the device's peak is in throughput.peak_tflops, and peak memory in GiB
(GPU: torch.cuda.max_memory_allocated; CPU: the process's peak resident set; the largest over
processes; both since the process started, never reset here). Per logging window as
throughput/* in the training log line (W&B curves, trainer_state.json's log history) and for the
whole train() call in metrics.json's train.throughput.

Counting: a forward pre-hook on the model sees every micro-batch Trainer feeds it in training
mode (gradient accumulation included; evaluation runs in eval mode and is not counted) and adds
its real tokens, Σ (real length)², and, for bertkit's pretraining model, the labelled positions
the MLM head runs on, to tensors on the device: read once per log line, so no step waits for
the GPU. Multiple choice (SWAG) feeds [batch, choices, length]: a sample is an example, the
FLOPs count batch x choices sequences. R3F's second, noisy forward pass (inputs_embeds, no
input_ids) is not counted. Under DDP the counts are summed over processes at log time.

Time: from the start of training to each log line, less evaluation, checkpoint saving and
bertkit's held-out evaluations (ThroughputMeter.excluded; a window restarts at their end), so
a window's figures are the training's alone; on a GPU the clock is read after a
synchronisation at log lines only. The whole run's figures are those of this train() call
(after resume=true: the part that ran).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import BertConfig, BertModel, Trainer, TrainerCallback

from bertkit.trainer_internals import callbacks_of, put_first
from bertkit.training.flops import peak_flops, training_flops
from bertkit.training.padding_masks import SEQUENCE_LENGTHS

logger = logging.getLogger(__name__)

PREFIX = "throughput/"
IGNORE_INDEX = -100  # labels of positions without a prediction
GIB = 2**30
# Counted per micro-batch: on the device (data-dependent) and on the host (shapes).
# packed_sequences: the sequences of padding-free batches (counted on the device; added to
# samples and sequences when a window closes).
DEVICE_COUNTS = ("real_tokens", "squared_lengths", "predicted_tokens", "packed_sequences")
HOST_COUNTS = ("positions", "samples", "sequences")


def device_name(device: torch.device) -> str:
    """The GPU's name as the peak table matches it ("NVIDIA H100 80GB HBM3"), else "cpu"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _tf32_matmuls() -> bool:
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if setting in ("tf32", "ieee"):
        return setting == "tf32"
    return torch.get_float32_matmul_precision() != "highest"


def precision_of(args) -> str:
    """The precision the matmuls run at, the peak table's column."""
    if args.bf16:
        return "bf16"
    if args.fp16:
        return "fp16"
    return "tf32" if args.device.type == "cuda" and _tf32_matmuls() else "fp32"


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs depend on besides the batches."""

    config: BertConfig
    pooled: bool  # the pooler (and a sequence head) runs on every sequence
    vocabulary: str | None  # the MLM head on "labelled" positions, on "all" (counted on the
    # real ones: the padding it also runs on is no useful work), or no MLM head
    backward: bool  # False: the encoder is frozen and run forward only (feature-based NER)


def model_shape(model: torch.nn.Module) -> ModelShape | None:
    """The BERT inside any task model (peft's wrapping, the feature-based tagger included);
    None for a model without a BertModel, whose FLOPs are then not counted."""
    bert = next((m for m in model.modules() if isinstance(m, BertModel)), None)
    if bert is None:
        return None
    unwrap = getattr(model, "get_base_model", None)
    base = unwrap() if callable(unwrap) else model
    if getattr(base, "mlm_on_labelled_positions_only", False):
        vocabulary = "labelled"  # bertkit's MaskedOnlyBertForPreTraining
    elif hasattr(getattr(base, "cls", None), "predictions"):
        vocabulary = "all"  # transformers' BertForPreTraining / BertForMaskedLM
    else:
        vocabulary = None
    config = bert.config
    rows = getattr(base, "vocab_rows", config.vocab_size)
    if rows != config.vocab_size:  # the FLOPs count the vocabulary predicted, not its padding
        config = BertConfig(**{**config.to_dict(), "vocab_size": rows})
    return ModelShape(config, bert.pooler is not None, vocabulary,
                      backward=any(p.requires_grad for p in bert.parameters()))


class ThroughputMeter(TrainerCallback):
    """Counts what the model is fed and times the training; see the module's docstring.
    Put first among the callbacks, so that the reporting callbacks (W&B) see the keys it adds
    to a log line. `record`: the whole run's figures once training ends."""

    def __init__(self, args, accelerator, peak_table: Mapping[str, Mapping[str, float]]):
        self.device = args.device
        self.accelerator = accelerator
        self.processes = accelerator.num_processes
        self.precision = precision_of(args)
        self.device_name = device_name(self.device)
        self.peak = peak_flops(self.device_name, self.precision, peak_table)
        self.shape: ModelShape | None = None
        self.record: dict | None = None
        self._handle = None
        self._start_window()

    # -- counting ---------------------------------------------------------------------------
    def _start_window(self) -> None:
        self._device_counts: torch.Tensor | None = None
        self._host_counts = dict.fromkeys(HOST_COUNTS, 0)
        self._seconds = 0.0

    # Not compiled with the model (trainer.torch_compile): its host counters would be guarded
    # values, a recompilation per step; it runs eagerly in front of the compiled forward.
    @torch.compiler.disable
    def _count(self, module, args, kwargs) -> None:
        if not module.training:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(ids, torch.Tensor):
            return  # R3F's noisy pass feeds inputs_embeds
        rows = ids.reshape(-1, ids.shape[-1])
        mask = kwargs.get("attention_mask")
        packed = kwargs.get(SEQUENCE_LENGTHS)
        if packed is not None:  # one row of sequences end to end: each slot's length
            lengths = packed.to(torch.int64)
        elif mask is not None:
            lengths = mask.reshape(-1, mask.shape[-1]).sum(-1, dtype=torch.int64)
        else:
            lengths = torch.full((rows.shape[0],), rows.shape[1], dtype=torch.int64,
                                 device=ids.device)
        # bertkit's pretraining batches name their masked slots mlm_labels (-100: unused).
        labels = kwargs.get("mlm_labels", kwargs.get("labels"))
        vocabulary = self.shape.vocabulary if self.shape is not None else None
        if vocabulary == "labelled" and isinstance(labels, torch.Tensor):
            predicted = (labels != IGNORE_INDEX).sum()
        elif vocabulary == "all":  # the full head on every position: useful on the real ones
            predicted = lengths.sum()
        else:
            predicted = torch.zeros((), dtype=torch.int64, device=ids.device)
        sequences = (lengths > 0).sum() if packed is not None else torch.zeros_like(predicted)
        counts = torch.stack([lengths.sum(), (lengths * lengths).sum(),
                              predicted.to(torch.int64), sequences.to(torch.int64)])
        self._device_counts = counts if self._device_counts is None \
            else self._device_counts + counts
        host = self._host_counts
        host["positions"] += rows.numel()
        if packed is None:
            host["samples"] += ids.shape[0]
            host["sequences"] += rows.shape[0]

    # -- time -------------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _lap(self, synchronize: bool = False) -> None:
        now = self._now() if synchronize else time.perf_counter()
        self._seconds += now - self._mark
        self._mark = now

    def _restart_clock(self) -> None:
        self._mark = time.perf_counter()

    # -- windows ----------------------------------------------------------------------------
    def _close_window(self) -> tuple[dict[str, int], float]:
        """The window's counts over all processes (a collective call: every process logs) and
        this process's training seconds in it; opens the next window."""
        self._lap(synchronize=True)
        device_counts = self._device_counts if self._device_counts is not None \
            else torch.zeros(len(DEVICE_COUNTS), dtype=torch.int64, device=self.device)
        host = [self._host_counts[name] for name in HOST_COUNTS]
        vector = torch.cat([device_counts.to(self.device),
                            torch.tensor([*host, peak_memory_bytes(self.device)],
                                         dtype=torch.int64, device=self.device)])
        if self.processes > 1:
            table = self.accelerator.gather(vector[None])
            vector = torch.cat([table[:, :-1].sum(0), table[:, -1].max()[None]])
        values = dict(zip((*DEVICE_COUNTS, *HOST_COUNTS, "memory"), vector.tolist(),
                          strict=True))
        packed = values.pop("packed_sequences")
        values["samples"] += packed
        values["sequences"] += packed
        seconds = self._seconds
        self._start_window()
        return values, seconds

    def figures(self, counts: Mapping[str, int], seconds: float) -> dict:
        shape = self.shape
        flops = None if shape is None else training_flops(
            shape.config, real_tokens=counts["real_tokens"],
            sum_squared_lengths=counts["squared_lengths"],
            predicted_tokens=counts["predicted_tokens"],
            sequences=counts["sequences"] if shape.pooled else 0, backward=shape.backward)
        timed = seconds > 0
        return {
            "tokens_per_second": counts["real_tokens"] / seconds if timed else None,
            "samples_per_second": counts["samples"] / seconds if timed else None,
            "real_token_share": (counts["real_tokens"] / counts["positions"]
                                 if counts["positions"] else None),
            "flops": flops,
            "mfu": (flops / (seconds * self.peak * self.processes)
                    if flops is not None and self.peak and timed else None),
            "peak_memory_gb": counts["memory"] / GIB,
        }

    def _finish(self) -> None:
        if self.record is not None or self._handle is None:
            return
        counts, seconds = self._close_window()
        self._add_to_totals(counts, seconds)
        totals, seconds = self._totals, self._total_seconds
        self.record = {**self.figures(totals, seconds), "device": self.device_name,
                       "precision": self.precision,
                       "peak_tflops": self.peak / 1e12 if self.peak else None,
                       "processes": self.processes, "seconds": seconds,
                       **{name: totals[name] for name in ("real_tokens", "positions", "samples",
                                                          "sequences", "predicted_tokens")}}
        if self.accelerator.is_main_process:
            record = self.record
            mfu = f"{record['mfu']:.1%}" if record["mfu"] is not None else "n/a"
            logger.info("throughput: %.0f real tokens/s, %.2f samples/s, %.1f%% real tokens, "
                        "MFU %s on %s (%s)", record["tokens_per_second"] or 0.0,
                        record["samples_per_second"] or 0.0,
                        100 * (record["real_token_share"] or 0.0), mfu, self.device_name,
                        self.precision)

    def _add_to_totals(self, counts: Mapping[str, int], seconds: float) -> None:
        for name, value in counts.items():
            self._totals[name] = max(self._totals[name], value) if name == "memory" \
                else self._totals[name] + value
        self._total_seconds += seconds

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Work beside training inside a step's events (bertkit's held-out evaluation): its
        time is left out of the window, as evaluation's and checkpoint saving's are."""
        if self._handle is not None:
            self._lap(synchronize=True)  # the step's own device work is training time
        try:
            yield
        finally:
            if self._handle is not None:
                self._restart_clock()

    # -- Trainer's events -------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.shape = model_shape(model)
        self.record = None
        self._totals = dict.fromkeys((*DEVICE_COUNTS[:-1], *HOST_COUNTS, "memory"), 0)
        self._total_seconds = 0.0
        self._start_window()
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)
        self._mark = self._now()

    def on_step_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._lap()

    def on_evaluate(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._restart_clock()  # evaluation is not training time

    def on_save(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._restart_clock()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._handle is None or logs is None:
            return control
        if "loss" in logs and self.record is None:  # a training window's line
            counts, seconds = self._close_window()
            self._add_to_totals(counts, seconds)
            if counts["positions"]:
                window = {f"{PREFIX}{name}": value
                          for name, value in self.figures(counts, seconds).items()
                          if value is not None and name != "flops"}
                logs.update(window)
                if state.log_history and state.log_history[-1].get("step") == state.global_step:
                    state.log_history[-1].update(window)
            self._restart_clock()  # the logging itself is not training time
        elif "train_loss" in logs:  # Trainer's closing line (train_runtime, train_loss, ...)
            self._finish()  # before loading the best checkpoint, which is no training
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return control


def excluded_from_throughput(trainer: Trainer) -> AbstractContextManager:
    """The trainer's meter's `excluded()`, or nothing to exclude from when it has none."""
    for callback in callbacks_of(trainer):
        if isinstance(callback, ThroughputMeter):
            return callback.excluded()
    return nullcontext()


def add_throughput(cfg: DictConfig, trainer: Trainer) -> ThroughputMeter | None:
    """The meter on the trainer, first among its callbacks, unless throughput.enabled=false
    (or the config has no throughput node)."""
    settings = OmegaConf.select(cfg, "throughput")
    if settings is None or not settings.enabled:
        return None
    table = OmegaConf.to_container(settings.peak_tflops, resolve=True) \
        if settings.get("peak_tflops") is not None else {}
    meter = ThroughputMeter(trainer.args, trainer.accelerator, table)
    put_first(trainer, meter)
    return meter

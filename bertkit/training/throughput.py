"""How fast a run trains and what it costs: BERT's parameters and FLOPs in closed form,
the device peaks, the throughput measured beside Trainer (tokens/s, MFU, peak memory), and the
device memory a job will take, estimated from its settings before anything loads.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoConfig,
    AutoModel,
    BertConfig,
    BertModel,
    PretrainedConfig,
    Trainer,
    TrainerCallback,
)

from bertkit.errors import BertkitError
from bertkit.training.models import _checkpoint_config, count_parameters, tokenizer_size
from bertkit.training.trainer import SEQUENCE_LENGTHS, callbacks_of, put_first

# ================================================================================================
# Parameters and training FLOPs of a BERT, in closed form, and the device peaks MFU divides by.
#
# Parameters (Devlin et al. 2019, "BERT", section 3; transformers' BertModel): embeddings V·H
# (WordPiece) + P·H (positions) + T·H (segments) + 2H (LayerNorm); per encoder layer 4H² + 4H
# (Q, K, V, output projections) + 2H (LayerNorm) + 2·H·I + I + H (feed-forward) + 2H (LayerNorm);
# pooler H² + H; MLM head H² + H + 2H (transform and its LayerNorm) + V (decoder bias: the decoder
# weight is the word embeddings, tied, counted once); NSP head 2H + 2. BERT-base: 109,482,240.
#
# Training FLOPs count matrix multiplications only, as Narayanan et al. 2021 ("Efficient
# Large-Scale Language Model Training on GPU Clusters", section 5.1) and PaLM's MFU (Chowdhery et
# al. 2022, appendix B) do: a multiply-accumulate is 2 FLOPs, the backward pass twice the forward
# (gradients for inputs and for weights), so a weight matrix costs 6 FLOPs per parameter per token:
# Kaplan et al. 2020's "C = 6N per token", with N the encoder's weight matrices, L·(4H² + 2·H·I).
# Biases, LayerNorm, GELU, softmax and dropout are elementwise (0.14% of BERT-base's encoder
# parameters, a smaller share of the time on tensor cores) and embedding lookups are gathers:
# neither is counted. Attention adds QKᵀ and AV, 2·s²·H multiply-accumulates per layer for a
# sequence of s tokens: 12·L·H·s per token with the backward pass (PaLM's 6N + 12·L·H·S).
#
# Everything is counted on real tokens, never on padding: MFU measures useful work, so padding
# lowers it. The same goes for the vocabulary: V is config.vocab_size of the model as saved, the
# tokenizer's size (BERT's 30,522), not the rows pretraining pads it to for tensor cores
# (pretraining.pad_vocab_to_multiple_of: 30,528); the padded rows' logits are computed and thrown
# away, work a faster shape buys but no useful FLOP (throughput.model_shape and bench_pretrain's
# useful FLOPs pass the unpadded size; bench_pretrain's hardware FLOPs the padded one).
# Heads: the MLM transform and vocabulary projection (H² + H·V) on the predicted
# positions only, which is what bertkit's MaskedOnlyBertForPreTraining computes (transformers'
# BertForPreTraining projects every position: pass predicted_tokens = every position for it); the
# pooler and a 2-way sequence head (NSP or SOP, H² + 2H) once per sequence. Finetuning heads are not
# counted: a sequence classifier's H·k (k ≤ 3 labels) per sequence is below the pooler's 1/H, and a
# token classifier's H·k per token (NER: k = 9; SQuAD: k = 2) is under 0.01% of BERT-base's
# encoder. Activation recomputation (gradient checkpointing) is not counted either: MFU counts the
# model's FLOPs, not the hardware's (PaLM, appendix B).

def parameter_counts(config: BertConfig) -> dict[str, int]:
    """Parameters per component of BertModel / BertForPreTraining, from the config alone."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    embeddings = (v + config.max_position_embeddings + config.type_vocab_size) * h + 2 * h
    attention = 4 * h * h + 4 * h + 2 * h  # Q, K, V, output; LayerNorm
    feed_forward = 2 * h * i + i + h + 2 * h  # up, down; LayerNorm
    layer = attention + feed_forward
    encoder = config.num_hidden_layers * layer
    pooler = h * h + h
    mlm_head = h * h + h + 2 * h + v  # transform, its LayerNorm, decoder bias (weight tied)
    nsp_head = 2 * h + 2
    bert_model = embeddings + encoder + pooler
    return {"embeddings": embeddings, "layer": layer, "encoder": encoder, "pooler": pooler,
            "mlm_head": mlm_head, "nsp_head": nsp_head, "bert_model": bert_model,
            "pretraining": bert_model + mlm_head + nsp_head}


def matmul_parameters(config: BertConfig) -> int:
    """The encoder's weight-matrix entries, L·(4H² + 2·H·I): Kaplan's N for a BERT."""
    h = config.hidden_size
    return config.num_hidden_layers * (4 * h * h + 2 * h * config.intermediate_size)


def training_flops(config: BertConfig, *, real_tokens: int, sum_squared_lengths: int,
                   predicted_tokens: int, sequences: int, backward: bool = True) -> float:
    """Matmul FLOPs of training on a set of batches (forward and backward), counted on
    real tokens only (see the module's docstring for what is counted and why).

    real_tokens: non-padding tokens; sum_squared_lengths: Σ s² over sequences of s real
    tokens; predicted_tokens: positions the vocabulary head runs on (0 for a finetuning model);
    sequences: sequences through the pooler and a 2-way sequence head (0 for a model without a
    pooler); backward=False: the forward pass alone (a frozen encoder, as in the feature-based
    approach).
    """
    h, v = config.hidden_size, config.vocab_size
    macs = (matmul_parameters(config) * real_tokens
            + 2 * config.num_hidden_layers * h * sum_squared_lengths  # QKᵀ and AV
            + (h * h + h * v) * predicted_tokens  # MLM transform and vocabulary projection
            + (h * h + 2 * h) * sequences)  # pooler and NSP/SOP head
    return float(2 * (3 if backward else 1) * macs)


def flops_per_token(config: BertConfig, seq_len: int, predicted_share: float = 0.15) -> float:
    """Training FLOPs per token for full sequences of seq_len real tokens, predicted_share of
    them predicted (0.15: BERT's masking; 0 for a finetuning model), one pooled sequence each."""
    return training_flops(config, real_tokens=seq_len, sum_squared_lengths=seq_len * seq_len,
                          predicted_tokens=predicted_share * seq_len, sequences=1) / seq_len


def _words(text: str) -> str:
    """Lower case, with runs of spaces, '-' and '_' as one space: 'H100_PCIe' = 'h100 pcie'."""
    return " ".join(part for part in re.split(r"[\s_\-]+", str(text).lower()) if part)


def peak_flops(device_name: str, precision: str,
               table: Mapping[str, Mapping[str, float]]) -> float | None:
    """The dense peak FLOP/s of the device at `precision` (bf16, fp16, tf32, fp32), from
    `table`: device key -> {precision: TFLOP/s} (conf/throughput/default.yaml's peak_tflops).

    A key matches when its words appear in the device name as whole words (case, spaces, '-'
    and '_' aside: "A10" matches "NVIDIA A10" but neither "NVIDIA A100-SXM4-80GB" nor
    "NVIDIA A10G"); the longest matching key wins ("H100 PCIe" over "H100"). None for an
    unknown device (a CPU), or a known one without that precision in its row.
    """
    name = _words(device_name)
    keys = sorted(table, key=lambda key: len(_words(key)), reverse=True)
    for key in keys:
        words = _words(key)
        if words and re.search(rf"(?<![a-z0-9]){re.escape(words)}(?![a-z0-9])", name):
            row = {str(p).lower(): value for p, value in table[key].items()}
            value = row.get(str(precision).lower())
            return None if value is None else float(value) * 1e12
    return None


# ================================================================================================
# Throughput of every training run, measured beside Trainer without forking its loop.
#
# Real (non-padding) tokens/s, samples/s, the share of real tokens among the positions fed,
# training FLOPs (above: matmuls on real tokens), MFU = FLOPs / (seconds x dense peak x
# processes) where the device's peak is in throughput.peak_tflops, and peak memory in GiB
# (GPU: torch.cuda.max_memory_allocated; CPU: the process's peak resident set; the largest over
# processes; both since the process started, never reset here). Per logging window as
# throughput/* in the training log line (W&B curves, trainer_state.json's log history) and for the
# whole train() call in metrics.json's train.throughput.
#
# Counting: a forward pre-hook on the model sees every micro-batch Trainer feeds it in training
# mode (gradient accumulation included; evaluation runs in eval mode and is not counted) and adds
# its real tokens, Σ (real length)², and, for bertkit's pretraining model, the labelled positions
# the MLM head runs on, to tensors on the device: read once per log line, so no step waits for
# the GPU. Multiple choice (SWAG) feeds [batch, choices, length]: a sample is an example, the
# FLOPs count batch x choices sequences. R3F's second, noisy forward pass (inputs_embeds, no
# input_ids) is not counted. Under DDP the counts are summed over processes at log time.
#
# Time: from the start of training to each log line, less evaluation, checkpoint saving and
# bertkit's held-out evaluations (ThroughputMeter.excluded; a window restarts at their end), so
# a window's figures are the training's alone; on a GPU the clock is read after a
# synchronisation at log lines only. The whole run's figures are those of this train() call
# (after resume=true: the part that ran).

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


def add_throughput(settings: DictConfig, trainer: Trainer) -> ThroughputMeter | None:
    """The meter on the trainer, first among its callbacks, unless throughput.enabled=false
    (`settings`: the throughput node)."""
    if not settings.enabled:
        return None
    table = OmegaConf.to_container(settings.peak_tflops, resolve=True) \
        if settings.peak_tflops is not None else {}
    meter = ThroughputMeter(trainer.args, trainer.accelerator, table)
    put_first(trainer, meter)
    return meter


# ================================================================================================
# How much device memory one finetune (or pretraining job) takes, from its settings alone,
# before anything loads: what hydra/launcher=gpu_pack multiplies by the jobs it puts on one GPU
# to refuse a packing that cannot fit (hydra_plugins/bertkit_gpu_pack_launcher).
#
# The estimate is the sum of three parts, each from a setting of the launcher's `memory` node
# (conf/hydra/launcher/gpu_pack.yaml, where the numbers' sources are given):
#
#   parameters x bytes_per_parameter
#       the parameters counted exactly on a model built on the meta device (no memory, no
#       weights read) from the preset's config: model.config for a model from scratch, the
#       checkpoint's config.json (local, or the Hub cache) for model.name_or_path; times the
#       bytes each holds in training (fp32 weights, gradients and AdamW's two moments).
#   batch x sequence length x hidden x layers x activation_values_per_hidden_unit x bytes
#       what the backward pass keeps of the forward pass (Korthikanti et al. 2022), at 2 bytes
#       a value under mixed precision and 4 in fp32.
#   process_overhead_gib
#       what each job's process holds whatever it trains: the CUDA context, library workspaces,
#       the caching allocator's reserve.
#
# It estimates, it does not measure: the task head (a few thousand parameters) is left out,
# evaluation (no gradients) is assumed to need less than training, and attention scores are
# not counted (fused attention, bertkit's default, keeps none).

# The keys job_memory reads (besides the launcher's sequence_length_keys, under task. and
# pretraining.): jobs whose overrides differ in none of these, nor in a config group, get the
# same estimate (a seed or a learning rate changes no memory), so a launch composes one job
# of each kind only.
READS = ("model.", "task.", "pretraining.", "trainer.per_device_train_batch_size",
         "mixed_precision")
# mixed_precision -> bytes of one activation value; "auto" is 16-bit on a GPU, fp32 on a CPU
# (bertkit.training.run.resolve_mixed_precision).
ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "no": 4}


@dataclass(frozen=True)
class JobMemory:
    """One job's estimate, with the numbers it was computed from (for the refusal's line)."""

    model: str
    parameters: int
    bytes_per_parameter: float
    batch: int
    sequence_length: int
    layers: int
    hidden: int
    activation_values: float
    activation_bytes: int
    process_overhead_gib: float

    @property
    def total_bytes(self) -> float:
        return (self.parameters * self.bytes_per_parameter
                + self.batch * self.sequence_length * self.hidden * self.layers
                * self.activation_values * self.activation_bytes
                + self.process_overhead_gib * GIB)

    def describe(self) -> str:
        precision = "16-bit" if self.activation_bytes == 2 else "fp32"
        return (f"{self.model}: {self.parameters:,} parameters x "
                f"{self.bytes_per_parameter:g} B (weights, gradients, AdamW states), "
                f"batch {self.batch} x {self.sequence_length} tokens x {self.layers} layers x "
                f"{self.hidden} hidden x {self.activation_values:g} {precision} activations, "
                f"{self.process_overhead_gib:g} GiB per process")


def memory_kind(overrides: list[str], groups: set[str]) -> tuple[str, ...]:
    """The overrides of a job that may change its estimate: those of READS and of config
    groups (a group, like recipe= or model=, may set any key)."""
    kept = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in groups or key.startswith(READS):
            kept.append(override)
    return tuple(kept)


def model_config(model: DictConfig) -> PretrainedConfig | None:
    """The config the job will build its model from; None when it is not at hand without the
    network (a Hub checkpoint not in the cache, a vocabulary the run writes first)."""
    if model.name_or_path:
        given = _checkpoint_config(model, local_only=True)
        if not given or "model_type" not in given:
            return None
        given = dict(given)
        try:
            return AutoConfig.for_model(given.pop("model_type"), **given)
        except (ValueError, KeyError):  # a model type transformers does not know
            return None
    given = OmegaConf.to_container(OmegaConf.select(model, "config") or {},
                                   resolve=True)
    vocab = given.pop("vocab_size", None) or tokenizer_size(model)
    if vocab is None:
        return None
    return BertConfig(vocab_size=vocab, **given)


def parameters_of(config: PretrainedConfig) -> int:
    """The encoder's parameters, built on the meta device: exact, and no memory taken."""
    with torch.device("meta"):
        return count_parameters(AutoModel.from_config(config))


def sequence_length(lengths: list) -> int | None:
    """The longest of the job's sequence lengths (the values of the launcher's
    sequence_length_keys, a pretraining job's long phase included; unset ones skipped)."""
    lengths = [int(length) for length in lengths if isinstance(length, int) and length > 0]
    return max(lengths, default=None)


def activation_bytes(mixed_precision, on_gpu: bool) -> int:
    precision = str(mixed_precision)
    if precision == "auto":
        return ACTIVATION_BYTES["bf16"] if on_gpu else ACTIVATION_BYTES["no"]
    if precision not in ACTIVATION_BYTES:
        raise BertkitError(f"mixed_precision={precision!r}: expected auto, bf16, fp16 or no")
    return ACTIVATION_BYTES[precision]


def job_memory(cfg: DictConfig, settings: DictConfig, on_gpu: bool,
               model_name: str | None = None,
               counted: dict | None = None) -> JobMemory | None:
    """One job's estimate from its composed config and the launcher's `memory` settings;
    None when the model's config or the sequence length is not known before the job runs.
    `counted` caches parameter counts over the jobs of a launch (one model, many jobs)."""
    length = sequence_length([OmegaConf.select(cfg, key)
                              for key in settings.sequence_length_keys])
    config = model_config(cfg.model)
    if length is None or config is None:
        return None
    key = config.to_json_string()
    counted = {} if counted is None else counted
    if key not in counted:
        counted[key] = parameters_of(config)
    family = OmegaConf.select(cfg, "task.family")  # None: pretraining
    per_example = int((settings.sequences_per_example or {}).get(family, 1)) if family else 1
    return JobMemory(
        model=model_name or str(cfg.model.name_or_path or "model.config"),
        parameters=counted[key],
        bytes_per_parameter=float(settings.bytes_per_parameter),
        batch=int(cfg.trainer.per_device_train_batch_size) * per_example,
        sequence_length=length,
        layers=int(config.num_hidden_layers),
        hidden=int(config.hidden_size),
        activation_values=float(settings.activation_values_per_hidden_unit),
        activation_bytes=activation_bytes(
            cfg.mixed_precision, on_gpu),
        process_overhead_gib=float(settings.process_overhead_gib),
    )

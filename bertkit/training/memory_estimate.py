"""How much device memory one finetune (or pretraining job) takes, from its settings alone,
before anything loads: what hydra/launcher=gpu_pack multiplies by the jobs it puts on one GPU
to refuse a packing that cannot fit (hydra_plugins/bertkit_gpu_pack_launcher).

The estimate is the sum of three parts, each from a setting of the launcher's `memory` node
(conf/hydra/launcher/gpu_pack.yaml, where the numbers' sources are given):

  parameters x bytes_per_parameter
      the parameters counted exactly on a model built on the meta device (no memory, no
      weights read) from the preset's config: model.config for a model from scratch, the
      checkpoint's config.json (local, or the Hub cache) for model.name_or_path; times the
      bytes each holds in training (fp32 weights, gradients and AdamW's two moments).
  batch x sequence length x hidden x layers x activation_values_per_hidden_unit x bytes
      what the backward pass keeps of the forward pass (Korthikanti et al. 2022), at 2 bytes
      a value under mixed precision and 4 in fp32.
  process_overhead_gib
      what each job's process holds whatever it trains: the CUDA context, library workspaces,
      the caching allocator's reserve.

It estimates, it does not measure: the task head (a few thousand parameters) is left out,
evaluation (no gradients) is assumed to need less than training, and attention scores are
not counted (fused attention, bertkit's default, keeps none).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig, AutoModel, BertConfig, PretrainedConfig

from bertkit.errors import BertkitError
from bertkit.training.models import _checkpoint_config, count_parameters, tokenizer_size

GIB = 1024**3
# The keys job_memory reads (besides the launcher's sequence_length_keys, under task. and
# pretraining.): jobs whose overrides differ in none of these, nor in a config group, get the
# same estimate (a seed or a learning rate changes no memory), so a launch composes one job
# of each kind only.
READS = ("model.", "task.", "pretraining.", "trainer.per_device_train_batch_size",
         "mixed_precision")
# mixed_precision -> bytes of one activation value; "auto" is 16-bit on a GPU, fp32 on a CPU
# (bertkit.training.arguments.resolve_mixed_precision).
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
    given = OmegaConf.to_container(OmegaConf.select(model, "config", default=None) or {},
                                   resolve=True)
    vocab = given.pop("vocab_size", None) or tokenizer_size(model)
    if vocab is None:
        return None
    return BertConfig(vocab_size=vocab, **given)


def parameters_of(config: PretrainedConfig) -> int:
    """The encoder's parameters, built on the meta device: exact, and no memory taken."""
    with torch.device("meta"):
        return count_parameters(AutoModel.from_config(config))


def sequence_length(cfg: DictConfig, keys: list[str]) -> int | None:
    """The longest of the job's sequence lengths among `keys` (a pretraining job's long phase
    included)."""
    lengths = [OmegaConf.select(cfg, key, default=None) for key in keys]
    lengths = [int(length) for length in lengths if isinstance(length, int) and length > 0]
    return max(lengths, default=None)


def activation_bytes(cfg: DictConfig, on_gpu: bool) -> int:
    precision = str(OmegaConf.select(cfg, "mixed_precision", default="auto"))
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
    length = sequence_length(cfg, list(settings.sequence_length_keys))
    config = model_config(cfg.model)
    if length is None or config is None:
        return None
    key = config.to_json_string()
    counted = {} if counted is None else counted
    if key not in counted:
        counted[key] = parameters_of(config)
    family = OmegaConf.select(cfg, "task.family", default=None)
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
        activation_bytes=activation_bytes(cfg, on_gpu),
        process_overhead_gib=float(settings.process_overhead_gib),
    )

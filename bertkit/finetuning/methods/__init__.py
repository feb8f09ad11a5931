"""The finetuning methods, written once for GLUE, SQuAD, SWAG and NER, and how the finetune job
(bertkit.jobs.finetune) runs those the `finetuning` node turns on.

METHODS is the one table of methods: each one's Method class (a module of this package) and
whether the node turns it on, read from the settings alone, in the order apply() runs them
(a re-initialised layer before LoRA wraps it, the scalar mix before freezing decides what
trains, LoRA after them). Only the methods turned on are imported: a plain finetune imports
none of their modules. Adding a method is a module here, its line in METHODS and a preset in
conf/finetuning/ (bitfit.py and conf/finetuning/bitfit.yaml, nothing else).

ActiveMethods runs them:

    apply(model)     each method's apply, in table order
    attach(trainer)  one optimizer group per depth when a method needs it, the methods'
                     callbacks
    finish(trainer)  each method's finish (LoRA: the adapter saved, the merged model in the
                     trainer)
    record()         what metrics.json and W&B get (settings and what was learned)

With every method off, nothing is touched: the run is Trainer's own, step for step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from pkgutil import resolve_name as imported

from omegaconf import DictConfig, OmegaConf
from torch import nn

from bertkit.errors import BertkitError
from bertkit.finetuning.layers import num_layers
from bertkit.finetuning.optimizer import GroupLearningRates, build_optimizer, parameter_groups
from bertkit.training.trainer import put_first, use_optimizer


@dataclass(frozen=True)
class Entry:
    """A method of METHODS: its class, and whether the `finetuning` node turns it on."""

    method: str  # "module:Class"
    on: Callable[[DictConfig], bool]


# The choices of two methods' options (bertkit.config_schema reads them; here, not in the
# methods' modules, which a run that does not use them never imports).
POOLING = ("cls", "mean")  # finetuning.pooling
NOISE = ("normal", "uniform")  # finetuning.r3f.noise

# finetuning method -> its Entry, in apply() order.
METHODS = {
    "reinit": Entry("bertkit.finetuning.methods.reinit:Reinit",
                    lambda s: s.reinit_layers != 0 or bool(s.reinit_pooler)),
    "layer_mix": Entry("bertkit.finetuning.methods.layer_mix:LayerMix",
                       lambda s: bool(s.layer_mix)),
    "mean_pooling": Entry("bertkit.finetuning.methods.mean_pooling:MeanPooling",
                          lambda s: s.pooling == "mean"),
    "r3f": Entry("bertkit.finetuning.methods.r3f:R3F", lambda s: s.r3f.weight > 0),
    "freeze": Entry("bertkit.finetuning.methods.freeze:Freeze",
                    lambda s: bool(s.freeze_embeddings) or s.freeze_layers != 0),
    # bitfit: a key of conf/finetuning/bitfit.yaml alone (absent from the other presets)
    "bitfit": Entry("bertkit.finetuning.methods.bitfit:BitFit",
                    lambda s: bool(s.get("bitfit"))),
    "lora": Entry("bertkit.finetuning.methods.lora:Lora", lambda s: bool(s.lora.enabled)),
    "layerwise_rates": Entry("bertkit.finetuning.methods.layerwise_rates:LayerwiseRates",
                             lambda s: s.layer_lr_decay != 1.0 or s.head_lr_multiplier != 1.0),
    "gradual_unfreezing": Entry(
        "bertkit.finetuning.methods.gradual_unfreezing:GradualUnfreezing",
        lambda s: s.unfreeze_every is not None),
}


class Method:
    """What one method does at each point of a finetune. A fresh instance per run holds that
    run's state (hooks, callbacks, what it learned); check reads settings alone."""

    def __init__(self, settings: DictConfig):
        self.settings = settings

    @classmethod
    def check(cls, settings: DictConfig, num_layers: int | None = None) -> None:
        """The rules between its keys and others, refused before any data is read (each key's
        own type and range is the schema's, bertkit.config_schema); num_layers (the model's,
        once known) bounds layer counts."""

    def apply(self, model: nn.Module) -> nn.Module:
        """The model with the method applied, before the Trainer is built."""
        return model

    def needs_layer_groups(self) -> bool:
        """The optimizer must hold one group per depth (embeddings, layer_i, head)."""
        return False

    def trains_later(self, name: str) -> bool:
        """A parameter frozen now that the method trains later: in the optimizer from the start."""
        return False

    def log_callbacks(self) -> list:
        """Callbacks that add keys to each training log: put before the reporting ones."""
        return []

    def callbacks(self, trainer) -> list:
        """Callbacks of its behaviour during training."""
        return []

    def finish(self, trainer, run_dir: Path, main: bool) -> None:
        """After training, before the final evaluation."""

    def record(self) -> dict:
        """What it did or learned, for metrics.json's details.finetuning and W&B."""
        return {}


def within_layers(key: str, value: int, num_layers: int | None) -> None:
    """A layer count of the node against the model's depth (None: not known yet)."""
    if num_layers is not None and value > num_layers:
        raise BertkitError(f"finetuning.{key}={value}: the model has only {num_layers} "
                           f"encoder layers")


def active_methods(settings: DictConfig) -> list[type[Method]]:
    """The classes of the methods the node turns on, in apply() order (only these imported)."""
    return [imported(entry.method) for entry in METHODS.values() if entry.on(settings)]


def is_plain(settings: DictConfig) -> bool:
    """Nothing on: the run is the paper's full finetuning, through Trainer's own optimizer."""
    return not any(entry.on(settings) for entry in METHODS.values())


def describe(settings: DictConfig) -> dict:
    """The node by plain names (metrics.json "finetuning", W&B config finetuning.*), an off
    method's options trimmed to its switch."""
    plain = OmegaConf.to_container(settings, resolve=True)
    if not plain["lora"]["enabled"]:
        plain["lora"] = {"enabled": False}
    if plain["intermediate"]["task"] is None:  # two-stage finetuning (bertkit.jobs.two_stage)
        plain["intermediate"] = {"task": None}
    return plain


class ActiveMethods:
    """The methods the `finetuning` node turns on, checked at once, applied to a family's
    model and Trainer."""

    def __init__(self, settings: DictConfig):
        self.settings = settings
        classes = active_methods(settings)
        for method in classes:
            method.check(settings)
        self.methods: list[Method] = [method(settings) for method in classes]

    @property
    def plain(self) -> bool:
        return not self.methods

    def apply(self, model: nn.Module) -> nn.Module:
        """The model with the methods applied (a peft model with LoRA)."""
        if self.plain:
            return model
        depth = num_layers(model)
        for method in self.methods:
            method.check(self.settings, depth)
        for method in self.methods:
            model = method.apply(model)
        return model

    def attach(self, trainer) -> None:
        """Optimizer groups and callbacks on a Trainer built around apply()'s model.

        Callbacks that add keys to the logs go first (Trainer puts the reporting callbacks
        before any given to it), and the layer-wise optimizer replaces the one Trainer would
        create: both through the trainer internals (bertkit.training.trainer)."""
        if self.plain:
            return
        callbacks = [callback for method in self.methods for callback in method.callbacks(trainer)]
        for callback in callbacks:
            trainer.add_callback(callback)
        firsts = [callback for method in self.methods for callback in method.log_callbacks()]
        if any(method.needs_layer_groups() for method in self.methods):
            model = trainer.model
            decay_names = {name for name in trainer.get_decay_parameter_names(model)
                           if "scalar_mix." not in name}
            settings = self.settings
            groups = parameter_groups(
                model, base_lr=trainer.args.learning_rate,
                weight_decay=trainer.args.weight_decay, decay_names=decay_names,
                num_layers=num_layers(model), layer_lr_decay=float(settings.layer_lr_decay),
                head_lr_multiplier=float(settings.head_lr_multiplier),
                include=lambda name, p: any(m.trains_later(name) for m in self.methods))
            use_optimizer(trainer, build_optimizer(trainer, groups))
            firsts.append(GroupLearningRates(trainer.optimizer))
        for callback in reversed(firsts):
            put_first(trainer, callback)

    def finish(self, trainer, run_dir: Path, main: bool) -> None:
        """After training, before evaluation (LoRA: the merged model in the trainer)."""
        for method in self.methods:
            method.finish(trainer, run_dir, main)

    def hyperparameters(self) -> dict:
        """The settings, for metrics.json's hyperparameters and the W&B config."""
        return {"finetuning": describe(self.settings)}

    def record(self) -> dict:
        """What was learned or done (metrics.json details.finetuning, W&B summary)."""
        return {key: value for method in self.methods for key, value in method.record().items()}

    def summary(self) -> dict[str, float]:
        """The numbers of record() flat, for the W&B summary (final/finetuning/<key>)."""
        flat: dict[str, float] = {}

        def walk(prefix: str, value) -> None:
            if isinstance(value, dict):
                for key, item in value.items():
                    walk(f"{prefix}/{key}", item)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    walk(f"{prefix}/{i}", item)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[prefix] = value

        walk("finetuning", self.record())
        return flat

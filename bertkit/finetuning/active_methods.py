"""Applies the `finetuning` node to any family's model and Trainer, in the finetune job
(bertkit.training.finetune), so that every method is written once for GLUE, SQuAD, SWAG and NER.
The methods are the registry's (bertkit.finetuning.method, one module each in methods/);
ActiveMethods runs those the node turns on:

    apply(model)     each method's apply, in registry order (re-init first, LoRA last)
    attach(trainer)  one optimizer group per depth when a method needs it, the methods'
                     callbacks
    finish(trainer)  each method's finish (LoRA: the adapter saved, the merged model in the
                     trainer)
    record()         what metrics.json and W&B get (settings and what was learned)

With every method off, nothing is touched: the run is Trainer's own, step for step.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from bertkit.finetuning.callbacks import GroupLearningRates
from bertkit.finetuning.layers import num_layers
from bertkit.finetuning.method import Method, registered
from bertkit.finetuning.optimizer import build_optimizer, parameter_groups
from bertkit.finetuning.settings import check_settings, describe
from bertkit.trainer_internals import put_first, use_optimizer


class ActiveMethods:
    def __init__(self, settings: DictConfig):
        check_settings(settings)
        self.settings = settings
        self.methods: list[Method] = [method(settings) for method in registered()
                                      if method.active(settings)]

    @property
    def plain(self) -> bool:
        return not self.methods

    def apply(self, model: nn.Module) -> nn.Module:
        """The model with the methods applied (a peft model with LoRA)."""
        if self.plain:
            return model
        check_settings(self.settings, num_layers(model))
        for method in self.methods:
            model = method.apply(model)
        return model

    def attach(self, trainer) -> None:
        """Optimizer groups and callbacks on a Trainer built around apply()'s model.

        Callbacks that add keys to the logs go first (Trainer puts the reporting callbacks
        before any given to it), and the layer-wise optimizer replaces the one Trainer would
        create: both through bertkit.trainer_internals."""
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

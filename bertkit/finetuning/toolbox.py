"""Applies the `finetuning` node to any family's model and Trainer, in the finetuning template
(bertkit.training.finetune), so that every method is written once for GLUE, SQuAD, SWAG and NER:

    prepare(model)   re-init top layers -> layer mix, pooling -> R3F -> freezing -> LoRA
    attach(trainer)  layer-wise optimizer groups, their learning rates in the logs,
                     gradual unfreezing
    finish(trainer)  LoRA: the adapter saved, the merged model evaluated and saved
    record()         what metrics.json and W&B get (settings and what was learned)

With every method off, nothing is touched: the run is Trainer's own, step for step.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from bertkit.errors import BertkitError
from bertkit.finetuning.callbacks import GradualUnfreezing, GroupLearningRates, LogR3F
from bertkit.finetuning.freezing import freeze
from bertkit.finetuning.layers import HEAD, depth_of, num_layers
from bertkit.finetuning.optimizer import build_optimizer, parameter_groups
from bertkit.finetuning.reinit import reinit_top_layers
from bertkit.finetuning.settings import check_settings, describe, is_plain, unfreeze_every


class Toolbox:
    def __init__(self, settings: DictConfig):
        check_settings(settings)
        self.settings = settings
        self.num_layers: int | None = None
        self.facts: dict = {}
        self.mix = None
        self.r3f = None
        self.unfreezing: GradualUnfreezing | None = None

    @property
    def plain(self) -> bool:
        return is_plain(self.settings)

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model with the methods applied (a peft model with LoRA)."""
        settings = self.settings
        if self.plain:
            return model
        self.num_layers = num_layers(model)
        check_settings(settings, self.num_layers)
        if settings.reinit_layers:
            self.facts["reinitialised_layers"] = reinit_top_layers(model,
                                                                   settings.reinit_layers)
        if settings.layer_mix:
            from bertkit.finetuning.layer_mix import add_layer_mix

            self.mix = add_layer_mix(model)
        if settings.pooling == "mean":
            from bertkit.finetuning.layer_mix import use_mean_pooling

            use_mean_pooling(model)
        if settings.r3f.weight > 0:
            from bertkit.finetuning.r3f import add_r3f

            self.r3f = add_r3f(model, float(settings.r3f.weight), settings.r3f.noise,
                               float(settings.r3f.eps))
        if settings.freeze_embeddings or settings.freeze_layers:
            frozen = freeze(model, settings.freeze_embeddings, settings.freeze_layers)
            self.facts["frozen_parameters"] = sum(
                p.numel() for n, p in model.named_parameters() if n in set(frozen))
        if settings.lora.enabled:
            from bertkit.finetuning.lora import add_lora

            model = add_lora(model, settings.lora)
        return model

    def attach(self, trainer) -> None:
        """Optimizer groups and callbacks on a Trainer built around prepare()'s model."""
        settings = self.settings
        if self.plain:
            return
        every = unfreeze_every(settings)
        layerwise = settings.layer_lr_decay != 1.0 or settings.head_lr_multiplier != 1.0
        # The mix's weights and scale are not decayed towards uniform and zero.
        own_groups = layerwise or every is not None or settings.layer_mix
        if every is not None:
            if trainer.args.world_size > 1:
                raise BertkitError("finetuning.unfreeze_every does not run under torchrun: "
                                   "DistributedDataParallel fixes the trained parameters when "
                                   "it wraps the model, so layers unfrozen later would never "
                                   "be synchronised")
            self.unfreezing = GradualUnfreezing(trainer.model, self.num_layers, every)
            trainer.add_callback(self.unfreezing)
        if self.r3f is not None:
            trainer.callback_handler.callbacks.insert(0, LogR3F(self.r3f))
        if own_groups:
            model = trainer.model
            decay_names = {name for name in trainer.get_decay_parameter_names(model)
                           if "scalar_mix." not in name}
            groups = parameter_groups(
                model, base_lr=trainer.args.learning_rate,
                weight_decay=trainer.args.weight_decay, decay_names=decay_names,
                num_layers=self.num_layers, layer_lr_decay=float(settings.layer_lr_decay),
                head_lr_multiplier=float(settings.head_lr_multiplier),
                # Gradual unfreezing: the layers trained later are in the optimizer from the
                # start (Trainer's optimizer would hold only those trainable when it is built).
                include=lambda name, p: every is not None and depth_of(name) != HEAD)
            trainer.optimizer = build_optimizer(trainer, groups)
            # First, so that the reporting callbacks (W&B) log the added lr/<depth> keys.
            trainer.callback_handler.callbacks.insert(0, GroupLearningRates(trainer.optimizer))

    def finish(self, trainer, run_dir: Path, main: bool) -> None:
        """After training, before evaluation: LoRA's adapter saved, the merged model in the
        trainer (evaluated and saved like any other)."""
        if self.mix is not None:
            from bertkit.finetuning.layer_mix import scalar_mix_of

            self.mix = scalar_mix_of(trainer.model)  # under LoRA, peft trains a copy
        if self.settings.lora.enabled:
            from bertkit.finetuning.lora import merge_lora, save_adapter, trainable_summary

            self.facts["lora"] = trainable_summary(trainer.model)
            if main:
                self.facts["lora"]["adapter"] = str(save_adapter(trainer.model,
                                                                  run_dir / "adapter"))
            trainer.model = merge_lora(trainer.model)
            trainer.model_wrapped = trainer.model

    def hyperparameters(self) -> dict:
        """The settings, for metrics.json's hyperparameters and the W&B config."""
        return {"finetuning": describe(self.settings)}

    def record(self) -> dict:
        """What was learned or done (metrics.json details.finetuning, W&B summary)."""
        facts = dict(self.facts)
        if self.mix is not None:
            facts["layer_mix"] = {"weights": [round(float(w), 6)
                                              for w in self.mix.mixture().tolist()],
                                  "gamma": round(float(self.mix.gamma.detach()), 6)}
        if self.unfreezing is not None:
            unit = "epoch" if self.unfreezing.every == "epoch" else "step"
            facts[f"unfrozen_at_{unit}"] = {("embeddings" if d == 0 else f"layer_{d - 1}"): s
                                         for d, s in sorted(self.unfreezing.unfrozen_at.items())}
        return facts

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

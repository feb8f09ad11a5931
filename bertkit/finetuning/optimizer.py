"""The optimizer's parameter groups for layer-wise learning-rate decay (Sun et al. 2019;
ULMFiT's discriminative rates), with weight decay as Trainer applies it.

Why not Trainer's create_optimizer: it makes two groups (decay, no decay) at one learning rate,
and transformers has no layer-wise rates (its *_layerwise optimizers save memory, they do not
decay rates). The optimizer class and its arguments (fused AdamW, betas, eps) still come from
Trainer (get_optimizer_cls_and_kwargs), and its scheduler scales each group's own rate.

Each group is one depth (embeddings, layer_i, head) and one weight-decay setting; every
trainable parameter is in exactly one group; frozen ones are in none, except those that
gradual unfreezing will train later (they join now, at their own rate, and take no step while
they have no gradient). Each group's rate goes into the training logs (GroupLearningRates:
W&B curves lr/<group>).
"""

from __future__ import annotations

from torch import nn
from transformers import TrainerCallback

from bertkit.finetuning.layers import HEAD, depth_of, group_name


def learning_rate_of(depth: int | str, base: float, num_layers: int, decay: float,
                     head_multiplier: float) -> float:
    """Layer l (1..L) gets base * decay^(L - l), the embeddings (depth 0) base * decay^L, the
    head base * head_multiplier."""
    if depth == HEAD:
        return base * head_multiplier
    return base * decay ** (num_layers - depth)


def parameter_groups(model: nn.Module, *, base_lr: float, weight_decay: float,
                     decay_names: set[str], num_layers: int, layer_lr_decay: float,
                     head_lr_multiplier: float, include=lambda name, parameter: True
                     ) -> list[dict]:
    """Groups named `<depth>` and `<depth>/no_decay`; `include` picks the
    parameters beyond the trainable ones (gradual unfreezing's later layers)."""
    groups: dict[str, dict] = {}
    for name, parameter in model.named_parameters():
        if not (parameter.requires_grad or include(name, parameter)):
            continue
        depth = depth_of(name)
        decays = name in decay_names
        key = group_name(depth) + ("" if decays else "/no_decay")
        group = groups.setdefault(key, {
            "name": key, "params": [], "param_names": [],
            "weight_decay": weight_decay if decays else 0.0,
            "lr": learning_rate_of(depth, base_lr, num_layers, layer_lr_decay,
                                   head_lr_multiplier)})
        group["params"].append(parameter)
        group["param_names"].append(name)

    def order(key: str) -> tuple:
        """From the top layer down, then the head: Trainer logs the first group's rate as
        learning_rate, and the top layer's is trainer.learning_rate itself."""
        depth = key.split("/")[0]
        rank = (10**6 if depth == HEAD else -1 if depth == "embeddings"
                else int(depth.split("_")[1]))
        return -rank if depth != HEAD else rank, key

    return [groups[key] for key in sorted(groups, key=order)]


def build_optimizer(trainer, groups: list[dict]):
    """Trainer's optimizer class and arguments (args.optim, betas, eps) over `groups`."""
    optimizer_cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    kwargs = {key: value for key, value in kwargs.items() if key != "lr"}
    # torch optimizers keep extra group keys: name and param_names stay for logging and tests.
    return optimizer_cls(groups, lr=trainer.args.learning_rate, **kwargs)


class GroupLearningRates(TrainerCallback):
    """Adds lr/<depth> (embeddings, layer_i, head) to each training log: the rate each group
    stepped with, read before the optimizer step (the scheduler moves it right after). Put first
    among the callbacks, so that the reporting callbacks (W&B) see the added keys; they go into
    the state's log history too (trainer_state.json)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.rates: dict[str, float] = {}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # <depth> and <depth>/no_decay share a rate.
        self.rates = {f"lr/{group['name'].split('/')[0]}": group["lr"]
                      for group in self.optimizer.param_groups}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs and self.rates:
            logs.update(self.rates)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self.rates)
        return control

"""Where each parameter of a BERT task model sits: the embeddings (depth 0), encoder layer i
(depth i + 1), or the task head (everything else: pooler, classifier, span or tag outputs,
the scalar mix). Read from parameter names, so the same map holds for every family's model,
under peft's wrapping (base_model.model.<name>) and with LoRA's added weights. Freezing by
depth (freeze, set_trainable): the parameters stop taking gradients, and the optimizer
(bertkit.finetuning.optimizer) leaves them out.
"""

from __future__ import annotations

import re

from torch import nn

from bertkit.errors import BertkitError

EMBEDDINGS = re.compile(r"(?:^|\.)embeddings\.")
ENCODER_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")
HEAD = "head"


def encoder(model: nn.Module) -> nn.Module:
    """The BertModel inside a task model (or the model itself)."""
    inner = getattr(model, "get_base_model", None)
    model = inner() if callable(inner) else model  # a peft model: the wrapped task model
    prefix = getattr(model, "base_model_prefix", None)
    found = getattr(model, prefix, None) if prefix else None
    found = found if found is not None else model
    if not hasattr(found, "encoder") or not hasattr(found, "embeddings"):
        raise BertkitError(f"finetuning: {type(model).__name__} has no BERT encoder "
                           f"(embeddings + encoder.layer) to apply the finetuning methods to")
    return found


def num_layers(model: nn.Module) -> int:
    return len(encoder(model).encoder.layer)


def depth_of(name: str) -> int | str:
    """0 for the embeddings, i + 1 for encoder layer i, HEAD for the rest."""
    if EMBEDDINGS.search(name):
        return 0
    match = ENCODER_LAYER.search(name)
    return int(match.group(1)) + 1 if match else HEAD


def group_name(depth: int | str) -> str:
    """embeddings, layer_0 ... layer_<L-1>, head: the names of the optimizer's groups."""
    if depth == HEAD:
        return HEAD
    return "embeddings" if depth == 0 else f"layer_{depth - 1}"


def head_module_names(model: nn.Module) -> list[str]:
    """The top-level modules of the task model that are not the encoder (classifier,
    qa_outputs, ...): what a new task head is, and what LoRA must train and save in full."""
    inner = getattr(model, "get_base_model", None)
    model = inner() if callable(inner) else model
    prefix = getattr(model, "base_model_prefix", None)
    return [name for name, module in model.named_children()
            if name != prefix and any(True for _ in module.parameters())]


def set_trainable(model: nn.Module, depths, trainable: bool) -> list[str]:
    """requires_grad of every parameter at one of `depths` (0: embeddings, i + 1: layer i);
    returns their names."""
    names = []
    for name, parameter in model.named_parameters():
        depth = depth_of(name)
        if depth != HEAD and depth in depths:
            parameter.requires_grad_(trainable)
            names.append(name)
    return names


def freeze(model: nn.Module, embeddings: bool, layers: int) -> list[str]:
    """Freezes the embeddings (if asked) and encoder layers 0 .. layers - 1."""
    depths = ({0} if embeddings else set()) | set(range(1, layers + 1))
    return set_trainable(model, depths, False)

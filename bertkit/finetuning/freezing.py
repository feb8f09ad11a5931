"""Freezing the embeddings and/or the bottom encoder layers: their parameters stop taking
gradients, and the optimizer (bertkit.finetuning.optimizer) leaves them out."""

from __future__ import annotations

from torch import nn

from bertkit.finetuning.layers import HEAD, depth_of


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

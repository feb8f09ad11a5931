"""Re-initialising the top encoder layers before finetuning (Zhang et al. 2021): the top of a
pretrained BERT is specialised to the pretraining objective, and starting it afresh helps small
tasks in their experiments. Uses the model's own initializer (BertPreTrainedModel._init_weights:
normal(0, initializer_range) weights, zero biases, unit LayerNorm), as their code does."""

from __future__ import annotations

import torch
from torch import nn

from bertkit.finetuning.layers import encoder


def reinit_top_layers(model: nn.Module, count: int) -> list[int]:
    """Re-initialises the top `count` encoder layers; returns their indices."""
    if count == 0:
        return []
    inner = getattr(model, "get_base_model", None)
    owner = inner() if callable(inner) else model  # the PreTrainedModel with _init_weights
    layers = encoder(model).encoder.layer
    chosen = list(range(len(layers) - count, len(layers)))
    with torch.no_grad():
        for index in chosen:
            for module in layers[index].modules():
                # transformers 5's init functions skip tensors a checkpoint load marked as
                # initialised: unmark them, or the layer would silently keep its weights.
                for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    if hasattr(tensor, "_is_hf_initialized"):
                        tensor._is_hf_initialized = False
                owner._init_weights(module)
    return chosen

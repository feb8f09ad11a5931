"""Re-initialising the top encoder layers (and the pooler) before finetuning (Zhang et al.
2021): the top of a pretrained BERT is specialised to the pretraining objective, and starting it
afresh helps small tasks in their experiments. Uses the model's own initializer
(BertPreTrainedModel._init_weights: normal(0, initializer_range) weights, zero biases, unit
LayerNorm), as their code does."""

from __future__ import annotations

import torch
from torch import nn

from bertkit.finetuning.layers import encoder
from bertkit.finetuning.methods import Method, within_layers


class Reinit(Method):
    @classmethod
    def check(cls, settings, num_layers=None) -> None:
        within_layers("reinit_layers", settings.reinit_layers, num_layers)

    def apply(self, model):
        self.layers, self.pooler = reinit_top_layers(model, self.settings.reinit_layers,
                                                     pooler=bool(self.settings.reinit_pooler))
        return model

    def record(self) -> dict:
        return {"reinitialised_layers": self.layers, "reinitialised_pooler": self.pooler}


def _draw_afresh(owner: nn.Module, part: nn.Module) -> None:
    for module in part.modules():
        # transformers 5's init functions skip tensors a checkpoint load marked as initialised:
        # unmark them, or the module would silently keep its weights.
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if hasattr(tensor, "_is_hf_initialized"):
                tensor._is_hf_initialized = False
        owner._init_weights(module)


def reinit_top_layers(model: nn.Module, count: int, pooler: bool = False) -> tuple[list[int], bool]:
    """Re-initialises the top `count` encoder layers and, if asked and the model has one, BERT's
    pooler (their code's --reinit_pooler); returns the layers' indices and whether the pooler
    was drawn afresh (span and tag models have none)."""
    inner = getattr(model, "get_base_model", None)
    owner = inner() if callable(inner) else model  # the PreTrainedModel with _init_weights
    bert = encoder(model)
    layers = bert.encoder.layer
    chosen = list(range(len(layers) - count, len(layers))) if count else []
    has_pooler = pooler and getattr(bert, "pooler", None) is not None
    with torch.no_grad():
        for index in chosen:
            _draw_afresh(owner, layers[index])
        if has_pooler:
            _draw_afresh(owner, bert.pooler)
    return chosen, has_pooler

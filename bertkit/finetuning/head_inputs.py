"""What the task head reads, set with forward hooks so that it holds for every BERT task model,
under any family's Trainer and under peft's wrapping, without forking the model classes.

Scalar mix (ELMo, Peters et al. 2018; Kondratyuk & Straka 2019): the head reads
gamma * sum_j softmax(w)_j h_j over the embedding output h_0 and every layer's output h_1..h_L,
since the layer that suits a task is not always the last. The mix replaces the encoder's
last_hidden_state, so BERT's pooler, the tagger and the span head all read it. The layers are
captured with hooks rather than output_hidden_states, which would put every layer into each
prediction the Trainer gathers. transformers 5 checkpoints BertLayer.forward, not __call__, so
the hooks stay outside gradient checkpointing and do not fire again in the backward replay.

Mean pooling: the classifier reads the mean of the final (possibly mixed) hidden states over
the real tokens instead of [CLS] through the pooler, straight (no dense + tanh), as
sentence-transformers does.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.finetuning.layers import encoder

ATTRIBUTE = "scalar_mix"
_NO_POOLED_OUTPUT = ("ForTokenClassification", "ForQuestionAnswering")


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(weights)_j * tensors[j]; weights start at zero (a plain average)
    and gamma at one."""

    def __init__(self, num_tensors: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_tensors))
        self.gamma = nn.Parameter(torch.ones(1))

    def mixture(self) -> torch.Tensor:
        return torch.softmax(self.weights, dim=0)

    def forward(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != len(self.weights):
            raise ValueError(f"ScalarMix of {len(self.weights)} tensors got {len(tensors)}")
        # In the tensors' dtype: float32 weights would turn a bf16 model's states into float32.
        dtype = tensors[0].dtype
        weights = self.mixture().to(dtype)
        mixed = weights[0] * tensors[0]
        for weight, tensor in zip(weights[1:], tensors[1:], strict=True):
            mixed = mixed + weight * tensor
        return self.gamma.to(dtype) * mixed


def _task_model(model: nn.Module) -> nn.Module:
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) else model


def scalar_mix_of(model: nn.Module) -> ScalarMix | None:
    """The mix that is trained: under peft's modules_to_save, its active copy, not the frozen
    original that add_layer_mix returned."""
    mix = getattr(_task_model(model), ATTRIBUTE, None)
    copies = getattr(mix, "modules_to_save", None)
    if copies is not None:
        active = mix.active_adapter
        active = active[0] if isinstance(active, (list, tuple)) else active
        return copies[active] if active in copies else mix.original_module
    return mix


def add_layer_mix(model: nn.Module) -> ScalarMix:
    """Attaches a ScalarMix over the embedding output and every layer as the task model's
    `scalar_mix` (in the state dict, saved and trained with the model) and makes the encoder's
    output the mix."""
    owner = _task_model(model)
    bert = encoder(owner)
    if hasattr(owner, ATTRIBUTE):
        raise BertkitError("finetuning.layer_mix: the model already has a scalar mix")
    layers = bert.encoder.layer
    reference = next(bert.parameters())
    mix = ScalarMix(len(layers) + 1).to(reference.device)
    owner.scalar_mix = mix
    captured: list[torch.Tensor] = []

    def embeddings_hook(module, args, output):
        captured.clear()  # a new forward (or one that was interrupted before the encoder ended)
        captured.append(output)

    def layer_hook(module, args, output):
        captured.append(output[0] if isinstance(output, tuple) else output)

    def encoder_hook(module, args, output):
        if len(captured) != len(layers) + 1:
            count = len(captured)
            captured.clear()
            raise RuntimeError(f"finetuning.layer_mix: captured {count} of the "
                               f"{len(layers) + 1} hidden states; the encoder must be run "
                               f"through the model's embeddings")
        # Looked up at each call: peft's modules_to_save puts a wrapper there, whose active copy
        # is the one trained.
        mixed = getattr(owner, ATTRIBUTE)(list(captured))
        captured.clear()
        if isinstance(output, tuple):
            return (mixed, *output[1:])
        output.last_hidden_state = mixed
        return output

    bert.embeddings.register_forward_hook(embeddings_hook)
    for layer in layers:
        layer.register_forward_hook(layer_hook)
    bert.encoder.register_forward_hook(encoder_hook)
    return mix


def use_mean_pooling(model: nn.Module) -> None:
    """Makes BERT's pooled output the masked mean of the final hidden states. Only for heads
    that read the pooled output (sequence classification, multiple choice). The pooler's own
    weights are then unused and frozen, so that DistributedDataParallel does not wait for their
    gradients."""
    owner = _task_model(model)
    bert = encoder(owner)
    pooler = getattr(bert, "pooler", None)
    if pooler is None or type(owner).__name__.endswith(_NO_POOLED_OUTPUT):
        raise BertkitError(f"finetuning.pooling=mean: {type(owner).__name__} does not read a "
                           f"pooled sentence vector (token classification and question "
                           f"answering read every token); use finetuning.pooling=cls")
    parameters = list(inspect.signature(bert.forward).parameters)
    position = parameters.index("attention_mask") if "attention_mask" in parameters else None
    state: dict[str, torch.Tensor | None] = {"mask": None}

    def capture_mask(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None and position is not None and len(args) > position:
            mask = args[position]
        state["mask"] = mask

    def release_mask(module, args, output):
        state["mask"] = None

    def mean_pool(module, args, output):
        hidden = args[0]
        mask = state["mask"]
        if mask is None:
            return hidden.mean(dim=1)
        if mask.dim() != 2:
            raise BertkitError("finetuning.pooling=mean needs a [batch, sequence] "
                               f"attention_mask, got shape {tuple(mask.shape)}")
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    pooler.requires_grad_(False)
    bert.register_forward_pre_hook(capture_mask, with_kwargs=True)
    bert.register_forward_hook(release_mask)
    pooler.register_forward_hook(mean_pool)

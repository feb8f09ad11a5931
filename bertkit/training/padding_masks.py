"""Attention masks that cost the host nothing.

transformers turns a 2D padding mask into the attention kernel's 4D mask inside the model, and
before SDPA it asks whether the mask is all ones (`padding_mask.all()`, a host sync on a GPU) so
that an unpadded batch can go without one. Both answers are cheaper elsewhere: the collator's
batch is still on the host, where "is anything padded?" is free, so a batch without padding
goes to the model without a mask; and a padded batch's mask is expanded on the device into the
4D mask transformers would build (its documented input: a 4D mask is used as given), so the
model never asks. Results are unchanged: the same mask reaches the same kernel.
"""

from __future__ import annotations

import torch
from transformers import BertModel

MASK = "attention_mask"
# A padding-free batch's key (bertkit.pretraining.padding_free): each sequence's length, 0 in an
# unused slot; such a batch has no attention mask, its real tokens are these lengths' sum.
SEQUENCE_LENGTHS = "sequence_lengths"
# The kernels whose 4D mask is built here; FlashAttention-2 and flex attention take the 2D
# mask (flash unpads with it), and keep transformers' own path.
FOUR_D = ("sdpa", "eager")


class WithoutFullMasks:
    """A collator whose batches carry no attention mask when nothing in them is padded."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        batch = self.collator(features)
        mask = batch.get(MASK) if hasattr(batch, "get") else None
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and bool(mask.all()):
            del batch[MASK]
        return batch


def without_full_masks(collator):
    return collator if isinstance(collator, WithoutFullMasks) else WithoutFullMasks(collator)


def four_d_mask(mask: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """transformers' bidirectional mask for `implementation`: [batch, 1, query, key], True (or
    0.0 for eager's additive mask) where the key is a real token."""
    length = mask.shape[-1]
    keep = mask[:, None, None, :].bool().expand(mask.shape[0], 1, length, length)
    if implementation == "sdpa":
        return keep
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def _expand_mask(module: BertModel, args, kwargs):
    positional = MASK not in kwargs and len(args) > 1
    mask = args[1] if positional else kwargs.get(MASK)
    implementation = module.config._attn_implementation
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or implementation not in FOUR_D:
        return None
    mask = four_d_mask(mask, implementation, module.get_input_embeddings().weight.dtype)
    if positional:
        return (args[0], mask, *args[2:]), kwargs
    return args, {**kwargs, MASK: mask}


def attach_padding_masks(model: torch.nn.Module) -> None:
    """Every BertModel inside `model` (task heads, peft wrappers) builds its 4D mask here."""
    for module in model.modules():
        if isinstance(module, BertModel) and not getattr(module, "_bertkit_masks", False):
            module.register_forward_pre_hook(_expand_mask, with_kwargs=True)
            module._bertkit_masks = True

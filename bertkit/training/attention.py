"""Which attention kernel the model runs (model.attn_implementation), chosen once per run.

auto: FlashAttention-2 where its package is installed and a GPU runs the model, because with
a padded batch transformers then runs it on the real tokens only (varlen: the padding is cut
out before attention and put back after); PyTorch's fused SDPA everywhere else (CPU, or no
flash_attn). An explicit value (eager, sdpa, flash_attention_2, flex_attention) is passed to
transformers as it is.
"""

from __future__ import annotations

import importlib.util

import torch

CHOICES = ("auto", "eager", "sdpa", "flash_attention_2", "flex_attention")


def attention_implementation(setting: str | None) -> str:
    """`setting` is one of CHOICES (the schema's, bertkit.config_schema), or None: auto."""
    setting = setting or "auto"
    if setting != "auto":
        return setting
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"

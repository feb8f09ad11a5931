"""R3F (Aghajanyan et al. 2020, "Better Fine-Tuning by Reducing Representational Collapse"), the
simplest of the SMART regularisers (Jiang et al. 2020): in training, the loss gets
weight * symmetric KL between the predictions on the word embeddings and on the word embeddings
plus small noise, which keeps the finetuned function smooth around the inputs.

Added as a forward hook on the task model, so the same code serves sequence and token
classification, spans and multiple choice, under any family's Trainer and under peft's wrapping
(peft calls the task model, whose hooks fire). As in the paper's fairseq criterion, the noisy
forward reads `word_embeddings(input_ids).detach() + noise` (the model's weights get the
regulariser's gradient through both forwards, the embedding table through the clean one only)
and draws its own dropout masks.

The method: the term added to the loss (add_r3f), and its value in each training log (LogR3F).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import TrainerCallback

from bertkit.errors import BertkitError
from bertkit.finetuning.layers import encoder
from bertkit.finetuning.methods import Method

KEY = "finetuning.r3f"


class R3F(Method):
    def apply(self, model):
        r3f = self.settings.r3f
        self.state = add_r3f(model, float(r3f.weight), r3f.noise, float(r3f.eps))
        return model

    def log_callbacks(self) -> list:
        return [LogR3F(self.state)]


class LogR3F(TrainerCallback):
    """The R3F term (unweighted, of the latest batch) in each training log as r3f: how far the
    predictions move under the noise. First among the callbacks, like GroupLearningRates."""

    def __init__(self, r3f):
        self.r3f = r3f

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs and self.r3f.last_value is not None:
            logs["r3f"] = float(self.r3f.last_value)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1]["r3f"] = logs["r3f"]
        return control


def symmetric_kl(clean_logits: torch.Tensor, noisy_logits: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p||q) + KL(q||p) of the softmax over the last dimension, summed over it and averaged
    over the distributions (every leading position, or those where `mask` is nonzero). In float32,
    as fairseq computes it, so that bf16/fp16 training does not round the small term to zero."""
    log_p = F.log_softmax(clean_logits.float(), dim=-1)
    log_q = F.log_softmax(noisy_logits.float(), dim=-1)
    # KL(p||q) + KL(q||p) = sum (p - q)(log p - log q): exactly zero when the logits agree.
    per_row = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(-1)
    if mask is None:
        return per_row.mean()
    weights = mask.to(per_row.dtype)
    return (per_row * weights).sum() / weights.sum().clamp(min=1.0)


def _positions_kl(clean: torch.Tensor, noisy: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
    """Span logits [batch, positions]: one distribution over the positions per example; the
    padding gets probability zero (the lowest float, not -inf, so no inf - inf = nan)."""
    if mask is not None:
        padding = mask.reshape(clean.shape) == 0
        lowest = torch.finfo(torch.float32).min
        clean = clean.float().masked_fill(padding, lowest)
        noisy = noisy.float().masked_fill(padding, lowest)
    return symmetric_kl(clean, noisy)


def regulariser(output, noisy_output, attention_mask: torch.Tensor | None,
                problem_type: str | None = None) -> torch.Tensor:
    """The smoothness term for any of the task models' outputs."""
    if getattr(output, "start_logits", None) is not None:  # spans: start and end distributions
        return (_positions_kl(output.start_logits, noisy_output.start_logits, attention_mask)
                + _positions_kl(output.end_logits, noisy_output.end_logits, attention_mask))
    clean, noisy = output.logits, noisy_output.logits
    if problem_type == "regression" or (clean.dim() == 2 and clean.shape[-1] == 1):
        # No distribution to compare: the squared difference of the predicted values.
        return (clean.float() - noisy.float()).pow(2).sum(-1).mean()
    if problem_type == "multi_label_classification":
        # One Bernoulli per label: softmax over [z, 0] is [sigmoid(z), 1 - sigmoid(z)].
        clean = torch.stack([clean, torch.zeros_like(clean)], dim=-1)
        noisy = torch.stack([noisy, torch.zeros_like(noisy)], dim=-1)
        return symmetric_kl(clean, noisy)
    if clean.dim() == 3:  # tags [batch, positions, labels]: the real tokens only
        mask = attention_mask.reshape(clean.shape[:-1]) if attention_mask is not None else None
        return symmetric_kl(clean, noisy, mask)
    return symmetric_kl(clean, noisy)  # classes, or choices for multiple choice


class R3FTerm:
    """The hook's state: the settings, the noise, and the last term for logging."""

    def __init__(self, weight: float, noise: str, eps: float,
                 noise_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.weight, self.noise, self.eps = weight, noise, eps
        self.noise_fn = noise_fn or self.sample
        # The last unweighted term, a detached 0-dim tensor (float() it to log: kept a tensor so
        # that training does not wait for the GPU at every step). None before the first step.
        self.last_value: torch.Tensor | None = None
        self.handle = None
        self._running = False

    def sample(self, embeddings: torch.Tensor) -> torch.Tensor:
        if self.noise == "normal":
            return torch.randn_like(embeddings) * self.eps
        return torch.empty_like(embeddings).uniform_(-self.eps, self.eps)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def add_r3f(model: nn.Module, weight: float, noise: str, eps: float, *,
            noise_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> R3FTerm:
    """Registers the regulariser on the task model (or the task model inside a peft model);
    returns its state, with remove() and last_value. noise_fn(embeddings) -> noise replaces the
    sampler (tests). weight, noise and eps are finetuning.r3f's, held to R3FSchema before a
    finetune starts."""
    inner = getattr(model, "get_base_model", None)
    task_model = inner() if callable(inner) else model
    encoder(task_model)  # fails early, naming the method, for a model without a BERT encoder
    names = [name for name, p in inspect.signature(task_model.forward).parameters.items()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    state = R3FTerm(float(weight), noise, float(eps), noise_fn)

    def hook(module, args, kwargs, output):
        if not module.training or state._running:
            return None
        if isinstance(output, tuple):
            raise BertkitError(f"{KEY}: the model returned a tuple (return_dict=False); R3F "
                               f"needs its output object to find the loss and the logits")
        if getattr(output, "loss", None) is None:  # no labels: nothing to regularise
            return None
        inputs = {**dict(zip(names, args, strict=False)), **kwargs}
        input_ids = inputs.pop("input_ids", None)
        if input_ids is not None:
            embeddings = encoder(module).embeddings.word_embeddings(input_ids)
        elif inputs.get("inputs_embeds") is not None:
            embeddings = inputs["inputs_embeds"]
        else:
            raise BertkitError(f"{KEY}: the model was called without input_ids or "
                               f"inputs_embeds; R3F perturbs the word embeddings")
        embeddings = embeddings.detach()
        inputs["inputs_embeds"] = embeddings + state.noise_fn(embeddings)
        state._running = True
        try:
            noisy = module(**inputs)
        finally:
            state._running = False
        term = regulariser(output, noisy, inputs.get("attention_mask"),
                           getattr(getattr(module, "config", None), "problem_type", None))
        state.last_value = term.detach()
        output.loss = output.loss + state.weight * term.to(output.loss.dtype)
        return output

    state.handle = task_model.register_forward_hook(hook, with_kwargs=True)
    return state

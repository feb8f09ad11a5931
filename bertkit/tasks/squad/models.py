"""BERT with the SQuAD head."""

from __future__ import annotations

from omegaconf import DictConfig
from transformers import (
    AutoModelForQuestionAnswering,
    BertForQuestionAnswering,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bertkit.training.models import load_with_head


def load_question_answerer(model: DictConfig,
                           tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """BERT with a span head: a start and an end logit per token (SQuAD)."""
    return load_with_head(model, tokenizer, AutoModelForQuestionAnswering,
                           BertForQuestionAnswering, {})

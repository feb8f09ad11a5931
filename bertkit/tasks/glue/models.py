"""BERT with the GLUE head: classification over task.labels, or one-output regression."""

from __future__ import annotations

from omegaconf import DictConfig
from transformers import (
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bertkit.training.models import load_with_head


def load_sequence_classifier(
    model: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None
) -> PreTrainedModel:
    """BERT with a classification head (labels given) or a one-output regression head."""
    head = {"num_labels": 1, "problem_type": "regression"} if labels is None else {
        "num_labels": len(labels),
        "problem_type": "single_label_classification",
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }
    return load_with_head(model, tokenizer, AutoModelForSequenceClassification,
                           BertForSequenceClassification, head)

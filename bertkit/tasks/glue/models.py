"""BERT with the GLUE head: classification over the task's classes, or one-output regression."""

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
    model: DictConfig, tokenizer: PreTrainedTokenizerBase, class_names: list[str] | None
) -> PreTrainedModel:
    """BERT with a classification head over class_names (task.class_names, which its config's
    id2label/label2id name), or a one-output regression head (class_names None)."""
    head = {"num_labels": 1, "problem_type": "regression"} if class_names is None else {
        "num_labels": len(class_names),
        "problem_type": "single_label_classification",
        "id2label": dict(enumerate(class_names)),
        "label2id": {name: i for i, name in enumerate(class_names)},
    }
    return load_with_head(model, tokenizer, AutoModelForSequenceClassification,
                           BertForSequenceClassification, head)

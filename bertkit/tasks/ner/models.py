"""The NER model: BertForTokenClassification over task.labels, or the paper's feature-based
tagger on a frozen BERT (model.feature_based.enabled)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from transformers import (
    AutoModel,
    AutoModelForTokenClassification,
    BertForTokenClassification,
    BertModel,
    PreTrainedTokenizerBase,
)

from bertkit.tasks.ner.feature_based_tagger import FeatureBasedTagger
from bertkit.training.models import load_with_head


def load_tagger(model: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str]):
    """BertForTokenClassification, or FeatureBasedTagger with model.feature_based.enabled."""
    feature_based = OmegaConf.select(model, "feature_based")
    if feature_based is not None and feature_based.enabled:
        encoder = load_with_head(model, tokenizer, AutoModel, BertModel, {})
        return FeatureBasedTagger(encoder, len(labels), layers=feature_based.layers,
                                  classifier=feature_based.classifier,
                                  lstm_hidden_size=feature_based.lstm_hidden_size,
                                  lstm_layers=feature_based.lstm_layers,
                                  dropout=feature_based.dropout)
    head = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)}}
    return load_with_head(model, tokenizer, AutoModelForTokenClassification,
                          BertForTokenClassification, head)

"""The feature-based approach of the paper (section 5.3, Table 7): BERT frozen, a tagger trained
on a combination of its hidden layers.

Why a module of its own and not BertForTokenClassification with frozen weights: the features
are a combination of several layers (the paper's best, 96.1 dev F1, concatenates the last
four), the classifier is a two-layer BiLSTM, and the encoder must stay in eval mode (no
dropout: fixed features) while Trainer switches the model to train mode every step. The
forward pass has the signature and output of a transformers token classifier, so Trainer,
its checkpoints and the NER evaluation work unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import BertConfig, BertModel
from transformers.modeling_outputs import TokenClassifierOutput

from bertkit.config_schema import check_setting
from bertkit.data.atomic_files import read_json
from bertkit.errors import BertkitError

# name -> (how many encoder layers it needs, feature width in hidden sizes)
LAYER_COMBINATIONS = {
    "embeddings": (0, 1),          # the WordPiece + position + segment embeddings
    "last": (1, 1),
    "second_to_last": (2, 1),
    "sum_last_four": (4, 1),
    "weighted_sum_last_four": (4, 1),  # a learned softmax-weighted sum (the paper's row)
    "concat_last_four": (4, 4),
    "sum_all": (1, 1),             # the plain sum of every encoder layer's output
    "weighted_sum_all": (1, 1),    # a learned softmax-weighted sum (ELMo's scalar mix)
}
CLASSIFIERS = ("linear", "bilstm")
SETTINGS_FILE = "feature_based_tagger.json"


def check_settings(layers: str, classifier: str, num_hidden_layers: int | None = None) -> None:
    check_setting("model.feature_based.layers", layers)  # the schema's choices
    check_setting("model.feature_based.classifier", classifier)
    needed = LAYER_COMBINATIONS[layers][0]
    if num_hidden_layers is not None and num_hidden_layers < needed:
        raise BertkitError(f"model.feature_based.layers={layers} needs at least {needed} "
                           f"encoder layers; the model has {num_hidden_layers}")


class FeatureBasedTagger(nn.Module):
    """A frozen BertModel's hidden layers, combined, fed to a linear or BiLSTM tagger."""

    def __init__(self, encoder: BertModel, num_labels: int, *, layers: str = "concat_last_four",
                 classifier: str = "bilstm", lstm_hidden_size: int = 768, lstm_layers: int = 2,
                 dropout: float = 0.1):
        super().__init__()
        check_settings(layers, classifier, encoder.config.num_hidden_layers)
        self.settings = {"layers": layers, "classifier": classifier,
                         "lstm_hidden_size": lstm_hidden_size, "lstm_layers": lstm_layers,
                         "dropout": dropout, "num_labels": num_labels}
        self.encoder = encoder
        self.encoder.requires_grad_(False)
        self.encoder.eval()
        # Trainer and the W&B callback read model.config; the encoder's describes the features.
        self.config = encoder.config
        self.num_labels = num_labels
        hidden = encoder.config.hidden_size
        width = hidden * LAYER_COMBINATIONS[layers][1]
        mixed = {"weighted_sum_all": encoder.config.num_hidden_layers,
                 "weighted_sum_last_four": 4}.get(layers)
        # ELMo's scalar mix: softmax-normalised layer weights (equal at first) and a scale.
        self.layer_weights = nn.Parameter(torch.zeros(mixed)) if mixed else None
        self.layer_scale = nn.Parameter(torch.ones(())) if mixed else None
        self.dropout = nn.Dropout(dropout)
        self.lstm = None
        if classifier == "bilstm":
            self.lstm = nn.LSTM(width, lstm_hidden_size, num_layers=lstm_layers,
                                bidirectional=True, batch_first=True,
                                dropout=dropout if lstm_layers > 1 else 0.0)
            width = 2 * lstm_hidden_size
        self.classifier = nn.Linear(width, num_labels)

    def train(self, mode: bool = True) -> FeatureBasedTagger:
        super().train(mode)
        self.encoder.eval()  # fixed features: no dropout in the encoder, ever
        return self

    def features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """hidden_states: the embeddings, then every encoder layer's output."""
        layers = self.settings["layers"]
        if layers == "embeddings":
            return hidden_states[0]
        if layers == "last":
            return hidden_states[-1]
        if layers == "second_to_last":
            return hidden_states[-2]
        if layers == "sum_last_four":
            return torch.stack(hidden_states[-4:]).sum(0)
        if layers == "concat_last_four":
            return torch.cat(hidden_states[-4:], dim=-1)
        if layers == "sum_all":
            return torch.stack(hidden_states[1:]).sum(0)
        mixed = hidden_states[-4:] if layers == "weighted_sum_last_four" else hidden_states[1:]
        weights = torch.softmax(self.layer_weights, dim=0)
        return self.layer_scale * torch.einsum("l,lbth->bth", weights, torch.stack(mixed))

    # No **kwargs: Trainer then averages the loss over gradient accumulation itself.
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                labels=None) -> TokenClassifierOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        with torch.no_grad():
            encoded = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids, output_hidden_states=True)
        hidden = self.dropout(self.features(encoded.hidden_states))
        if self.lstm is not None:
            lengths = attention_mask.sum(dim=1).cpu()
            packed = pack_padded_sequence(hidden, lengths, batch_first=True,
                                          enforce_sorted=False)
            output, _ = self.lstm(packed)
            hidden, _ = pad_packed_sequence(output, batch_first=True,
                                            total_length=hidden.shape[1])
            hidden = self.dropout(hidden)
        logits = self.classifier(hidden)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, self.num_labels),
                                               labels.view(-1), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)

    def save_settings(self, directory: str | Path, labels: list[str]) -> Path:
        """What load_feature_based_tagger needs beside Trainer's model.safetensors."""
        from bertkit.data.atomic_files import write_json_atomic

        return write_json_atomic(Path(directory) / SETTINGS_FILE, {
            **self.settings, "labels": labels, "encoder_config": self.encoder.config.to_dict()})


def load_feature_based_tagger(directory: str | Path) -> tuple[FeatureBasedTagger, list[str]]:
    """A tagger saved by a recipe=ner run (model/ of the run directory), and its labels."""
    from safetensors.torch import load_file

    directory = Path(directory)
    settings = read_json(directory / SETTINGS_FILE)  # a cut file: one line naming it
    encoder = BertModel(BertConfig.from_dict(settings.pop("encoder_config")))
    labels = settings.pop("labels")
    tagger = FeatureBasedTagger(encoder, settings.pop("num_labels"), **settings)
    tagger.load_state_dict(load_file(str(directory / "model.safetensors")))
    return tagger, labels

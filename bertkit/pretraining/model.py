"""BertForPreTraining whose masked-LM head runs on the masked positions only.

transformers' BertForPreTraining projects every position onto the vocabulary (batch x length
x 30,522 logits) and then ignores 85% of them. Google's and NVIDIA's BERT gather the masked
positions first; so does this subclass. Same parameters and state-dict keys as
BertForPreTraining, so its checkpoints load into any BERT class (and it saves itself under
that name). The loss is the paper's: mean MLM loss + mean NSP (or SOP) loss.

Its vocabulary rows may be padded (pad_vocabulary; pretraining.pad_vocab_to_multiple_of, 64 by
default) so that the MLM decoder's GEMM and the word embeddings have a tensor-core-friendly
shape, as NVIDIA's and MosaicML's BERT recipes do: the padding rows are zero, never predicted
(a -inf added to their logits before the softmax), never looked up (every id is below them), and
never saved (checkpoints and model/ hold the unpadded BertForPreTraining).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional
from transformers import BertConfig, BertForPreTraining, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

from bertkit.pretraining import batches
from bertkit.pretraining.batches import IGNORE_INDEX
from bertkit.training.models import (
    attention_setting,
    check_vocabulary,
    dropout_settings,
    from_pretrained,
    trusts_remote_code,
)


@dataclass
class PreTrainingStepOutput(ModelOutput):
    """The loss, its two terms (each a mean over its own items: the trainer weighs them by
    their share of the whole batch's under torchrun or accumulation), and detached per-batch
    statistics the trainer logs."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    sentence_loss: torch.Tensor | None = None
    mlm_loss_sum: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    sentence_loss_sum: torch.Tensor | None = None
    sentence_correct: torch.Tensor | None = None
    sentence_count: torch.Tensor | None = None


class MaskedOnlyBertForPreTraining(BertForPreTraining):
    # The vocabulary projection runs on the labelled positions only: what
    # bertkit.training.throughput counts its FLOPs on (transformers' class: every position).
    mlm_on_labelled_positions_only = True
    # The state-dict entries with a row (or an entry) per vocabulary id.
    VOCABULARY_ENTRIES = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias",
                          "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        # The vocabulary the model predicts and saves: config.vocab_size, until pad_vocabulary
        # adds rows that only round the matrices' shape.
        self.vocab_rows = config.vocab_size
        # -inf on the padding rows' logits, 0 elsewhere; None unpadded. A buffer, not a
        # parameter: no weight decay, no gradient, not saved.
        self.register_buffer("vocab_padding_mask", None, persistent=False)
        self.register_load_state_dict_pre_hook(_pad_loaded_vocabulary)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None,
                mlm_positions: torch.Tensor | None = None,
                mlm_labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                sequence_lengths: torch.Tensor | None = None,
                max_sequence_length: int | None = None) -> PreTrainingStepOutput:
        """The masked positions come as per-position `labels` (-100 elsewhere), or as
        bertkit's fixed slots (mlm_positions, mlm_labels: [batch, slots], -100 in the unused
        ones; bertkit.pretraining.batches): one shape per phase, no data-dependent indexing.

        A padding-free batch (bertkit.pretraining.batches) is one row of sequences end to
        end, each slot of sequence_lengths one sequence (0: unused), position_ids restarting
        at each; its sentence labels are per slot (-100: unused), scored on each [CLS]."""
        if sequence_lengths is None:
            sequence_output, pooled_output = self.bert(
                input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                position_ids=position_ids, return_dict=False)[:2]
        else:
            sequence_output, pooled_output = self._packed_encoder(
                input_ids, token_type_ids, position_ids, sequence_lengths, max_sequence_length)
        if mlm_positions is not None:
            index = mlm_positions[..., None].expand(-1, -1, sequence_output.shape[-1])
            predicted = sequence_output.gather(1, index).flatten(0, 1)
            targets = mlm_labels.flatten()
        elif labels is not None:
            masked = labels != IGNORE_INDEX
            predicted, targets = sequence_output[masked], labels[masked]
        else:
            raise ValueError("MaskedOnlyBertForPreTraining needs labels or mlm_positions and "
                             "mlm_labels")
        logits = self.vocabulary_logits(predicted)
        token_losses = functional.cross_entropy(logits, targets, reduction="none",
                                                ignore_index=IGNORE_INDEX)
        weights = targets != IGNORE_INDEX
        mlm_count = weights.sum()
        # A batch with nothing masked contributes a zero loss rather than NaN.
        loss = token_losses.sum() / mlm_count.clamp(min=1)
        output = PreTrainingStepOutput(
            mlm_loss=loss,
            mlm_loss_sum=token_losses.detach().sum(),
            mlm_correct=((logits.detach().argmax(-1) == targets) & weights).sum(),
            mlm_count=mlm_count)

        sentence_logits = self.cls.seq_relationship(pooled_output).float()
        if next_sentence_label is None:
            # MLM only: the sentence head gets no loss, but stays in the graph so that DDP
            # (find_unused_parameters=false) sees a gradient for every parameter.
            output.sentence_loss = 0.0 * sentence_logits.sum()
            loss = loss + output.sentence_loss
        else:
            # A padding-free batch's unused sequence slots are labelled -100: not scored.
            sentence_losses = functional.cross_entropy(sentence_logits, next_sentence_label,
                                                       reduction="none",
                                                       ignore_index=IGNORE_INDEX)
            scored = next_sentence_label != IGNORE_INDEX
            sentence_count = scored.sum()
            output.sentence_loss = sentence_losses.sum() / sentence_count.clamp(min=1)
            loss = loss + output.sentence_loss
            output.sentence_loss_sum = sentence_losses.detach().sum()
            output.sentence_correct = ((sentence_logits.detach().argmax(-1)
                                        == next_sentence_label) & scored).sum()
            output.sentence_count = sentence_count
        output.loss = loss
        return output

    def _packed_encoder(self, input_ids, token_type_ids, position_ids, sequence_lengths,
                        max_sequence_length):
        """(hidden states [1, tokens, hidden], pooled [sequence slots, hidden]) of a
        padding-free batch: each sequence attends to itself (padding_free_attention), and the
        pooler reads each sequence's first token, its [CLS]."""
        if self.config._attn_implementation != batches.ATTENTION:
            raise ValueError("a padding-free batch needs the model's attention set to "
                             f"{batches.ATTENTION} (use_padding_free_attention)")
        tokens = input_ids.shape[-1]
        attention = batches.attention_inputs(sequence_lengths, tokens, max_sequence_length)
        sequence_output = self.bert(input_ids, token_type_ids=token_type_ids,
                                    position_ids=position_ids, return_dict=False,
                                    **attention)[0]
        starts = attention["cu_seq_lens_q"][:sequence_lengths.shape[0]].to(torch.int64)
        first_tokens = sequence_output[0, starts.clamp(max=tokens - 1)]
        return sequence_output, self.bert.pooler(first_tokens[:, None, :])

    def vocabulary_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLM head's logits (fp32): the padding rows' at -inf, so they never win argmax
        nor take probability mass in the loss. (Adding the mask, not slicing the rows off: a
        slice leaves strided logits: the head and loss 14% slower than with the add, 2 CPU
        cores, fp32.)"""
        logits = self.cls.predictions(hidden)
        if self.vocab_padding_mask is not None:
            logits = logits + self.vocab_padding_mask  # fp32: bf16 logits promote
        return logits.float()

    def pad_vocabulary(self, multiple: int) -> None:
        """Rounds the word embeddings (tied to the MLM decoder) and the decoder's bias up to a
        multiple of `multiple` rows (1: as they are) with transformers'
        resize_token_embeddings, the new rows zero. They get no gradient (never looked up,
        their logits at -inf), so AdamW and weight decay leave them zero: saving without
        them and padding again with zeros on load (checkpoints, resume) loses nothing."""
        rows = self.vocab_rows
        if self.config.vocab_size != rows:
            raise ValueError(f"the vocabulary is already padded ({rows} rows to "
                             f"{self.config.vocab_size})")
        if multiple <= 1 or rows % multiple == 0:
            return
        with torch.random.fork_rng(devices=[]):  # the same random state as unpadded after it
            self.resize_token_embeddings(pad_to_multiple_of=multiple, mean_resizing=False)
        with torch.no_grad():
            self.get_input_embeddings().weight[rows:].zero_()
            self.cls.predictions.bias[rows:].zero_()
        mask = torch.zeros(self.config.vocab_size, device=self.cls.predictions.bias.device)
        mask[rows:] = float("-inf")
        self.vocab_padding_mask = mask

    @property
    def vocab_padding_parameters(self) -> int:
        """Parameters in the padding rows (not the model's: it is saved without them)."""
        padding = self.config.vocab_size - self.vocab_rows
        return padding * (self.config.hidden_size + 1)

    def save_pretrained(self, save_directory, *args, state_dict=None, **kwargs):
        """Saved as BertForPreTraining without the vocabulary's padding rows: the weights and
        config.json are exactly that class's at the unpadded vocabulary size."""
        padded = self.config.vocab_size
        if padded != self.vocab_rows:
            state_dict = self.state_dict() if state_dict is None else state_dict
            state_dict = {name: value[:self.vocab_rows] if _vocabulary_entry(name) else value
                          for name, value in state_dict.items()}
        self.config.vocab_size = self.vocab_rows
        try:
            super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)
            self.config.architectures = [BertForPreTraining.__name__]
            self.config.save_pretrained(save_directory)
        finally:
            self.config.vocab_size = padded


def _vocabulary_entry(name: str) -> bool:
    """A state-dict key with a row per vocabulary id (a wrapper's prefix aside)."""
    return any(name == entry or name.endswith("." + entry)
               for entry in MaskedOnlyBertForPreTraining.VOCABULARY_ENTRIES)


def _pad_loaded_vocabulary(module, state_dict, prefix, *args) -> None:
    """load_state_dict's pre-hook: an unpadded state dict (what save_pretrained writes, which
    Trainer's resume loads) gets the padding rows back, zero (what they always are)."""
    rows = module.config.vocab_size
    for entry in module.VOCABULARY_ENTRIES:
        value = state_dict.get(prefix + entry)
        if value is not None and value.shape[0] == module.vocab_rows < rows:
            state_dict[prefix + entry] = functional.pad(
                value, (0, 0) * (value.dim() - 1) + (0, rows - module.vocab_rows))


def use_padding_free_attention(model: MaskedOnlyBertForPreTraining) -> None:
    """The model's attention becomes padding_free_attention: padding-free batches attend
    within each sequence, padded ones (the held-out sets) run SDPA as before."""
    batches.register_attention()
    model.set_attn_implementation(batches.ATTENTION)


def load_pretraining_model(model: DictConfig, tokenizer: PreTrainedTokenizerBase,
                           pad_vocab_to_multiple_of: int = 1) -> MaskedOnlyBertForPreTraining:
    """From random init by model.config (pretraining), or a checkpoint to pretrain further;
    its vocabulary rows then padded to a multiple of pad_vocab_to_multiple_of
    (pretraining.pad_vocab_to_multiple_of; 1: not padded), the real rows' weights unchanged."""
    loaded = _load(model, tokenizer)
    loaded.pad_vocabulary(pad_vocab_to_multiple_of)
    return loaded


def _load(model: DictConfig, tokenizer: PreTrainedTokenizerBase) -> MaskedOnlyBertForPreTraining:
    dropout = dropout_settings(model)
    if model.name_or_path:
        name = str(model.name_or_path)
        loaded = from_pretrained(MaskedOnlyBertForPreTraining, name, "model.name_or_path",
                                 "model", trust_remote_code=trusts_remote_code(model),
                                 **dropout, **attention_setting(model))
        check_vocabulary(model, len(tokenizer), {"vocab_size": (
            loaded.config.vocab_size, f"model.name_or_path={name}'s config.json vocab_size")})
        return loaded
    # The vocabulary may be the run's own (tokenizer_training): known only now.
    check_vocabulary(model, len(tokenizer))
    config = BertConfig(pad_token_id=tokenizer.pad_token_id,
                        **{"vocab_size": len(tokenizer), **OmegaConf.to_container(model.config)},
                        **dropout, **attention_setting(model))
    return MaskedOnlyBertForPreTraining(config)

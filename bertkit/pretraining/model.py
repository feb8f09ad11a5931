"""BertForPreTraining whose masked-LM head runs on the masked positions only.

transformers' BertForPreTraining projects every position onto the vocabulary (batch x length
x 30,522 logits) and then ignores 85% of them. Google's and NVIDIA's BERT gather the masked
positions first; so does this subclass. Same parameters and state-dict keys as
BertForPreTraining, so its checkpoints load into any BERT class (and it saves itself under
that name). The loss is the paper's: mean MLM loss + mean NSP (or SOP) loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional
from transformers import BertConfig, BertForPreTraining, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

from bertkit.pretraining import padding_free
from bertkit.pretraining.masking import IGNORE_INDEX
from bertkit.training.models import (
    attention_setting,
    check_vocabulary,
    dropout_settings,
    from_pretrained,
    trusts_remote_code,
)


@dataclass
class PreTrainingStepOutput(ModelOutput):
    """The loss, and detached per-batch statistics the trainer logs."""

    loss: torch.Tensor | None = None
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

        A padding-free batch (bertkit.pretraining.padding_free) is one row of sequences end to
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
        logits = self.cls.predictions(predicted).float()
        token_losses = functional.cross_entropy(logits, targets, reduction="none",
                                                ignore_index=IGNORE_INDEX)
        weights = targets != IGNORE_INDEX
        mlm_count = weights.sum()
        # A batch with nothing masked contributes a zero loss rather than NaN.
        loss = token_losses.sum() / mlm_count.clamp(min=1)
        output = PreTrainingStepOutput(
            mlm_loss_sum=token_losses.detach().sum(),
            mlm_correct=((logits.detach().argmax(-1) == targets) & weights).sum(),
            mlm_count=mlm_count)

        sentence_logits = self.cls.seq_relationship(pooled_output).float()
        if next_sentence_label is None:
            # MLM only: the sentence head gets no loss, but stays in the graph so that DDP
            # (find_unused_parameters=false) sees a gradient for every parameter.
            loss = loss + 0.0 * sentence_logits.sum()
        else:
            # A padding-free batch's unused sequence slots are labelled -100: not scored.
            sentence_losses = functional.cross_entropy(sentence_logits, next_sentence_label,
                                                       reduction="none",
                                                       ignore_index=IGNORE_INDEX)
            scored = next_sentence_label != IGNORE_INDEX
            sentence_count = scored.sum()
            loss = loss + sentence_losses.sum() / sentence_count.clamp(min=1)
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
        if self.config._attn_implementation != padding_free.ATTENTION:
            raise ValueError("a padding-free batch needs the model's attention set to "
                             f"{padding_free.ATTENTION} (use_padding_free_attention)")
        tokens = input_ids.shape[-1]
        attention = padding_free.attention_inputs(sequence_lengths, tokens, max_sequence_length)
        sequence_output = self.bert(input_ids, token_type_ids=token_type_ids,
                                    position_ids=position_ids, return_dict=False,
                                    **attention)[0]
        starts = attention["cu_seq_lens_q"][:sequence_lengths.shape[0]].to(torch.int64)
        first_tokens = sequence_output[0, starts.clamp(max=tokens - 1)]
        return sequence_output, self.bert.pooler(first_tokens[:, None, :])

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Saved as BertForPreTraining: the weights are exactly that class's."""
        super().save_pretrained(save_directory, *args, **kwargs)
        self.config.architectures = [BertForPreTraining.__name__]
        self.config.save_pretrained(save_directory)


def use_padding_free_attention(model: MaskedOnlyBertForPreTraining) -> None:
    """The model's attention becomes padding_free_attention: padding-free batches attend
    within each sequence, padded ones (the held-out sets) run SDPA as before."""
    padding_free.register_attention()
    model.set_attn_implementation(padding_free.ATTENTION)


def load_pretraining_model(model: DictConfig, tokenizer: PreTrainedTokenizerBase):
    """From random init by model.config (pretraining), or a checkpoint to pretrain further."""
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

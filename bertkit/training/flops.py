"""Parameters and training FLOPs of a BERT, in closed form, and the device peaks MFU divides by.

Parameters (Devlin et al. 2019, "BERT", section 3; transformers' BertModel): embeddings V·H
(WordPiece) + P·H (positions) + T·H (segments) + 2H (LayerNorm); per encoder layer 4H² + 4H
(Q, K, V, output projections) + 2H (LayerNorm) + 2·H·I + I + H (feed-forward) + 2H (LayerNorm);
pooler H² + H; MLM head H² + H + 2H (transform and its LayerNorm) + V (decoder bias: the decoder
weight is the word embeddings, tied, counted once); NSP head 2H + 2. BERT-base: 109,482,240.

Training FLOPs count matrix multiplications only, as Narayanan et al. 2021 ("Efficient
Large-Scale Language Model Training on GPU Clusters", section 5.1) and PaLM's MFU (Chowdhery et
al. 2022, appendix B) do: a multiply-accumulate is 2 FLOPs, the backward pass twice the forward
(gradients for inputs and for weights), so a weight matrix costs 6 FLOPs per parameter per token:
Kaplan et al. 2020's "C = 6N per token", with N the encoder's weight matrices, L·(4H² + 2·H·I).
Biases, LayerNorm, GELU, softmax and dropout are elementwise (0.14% of BERT-base's encoder
parameters, a smaller share of the time on tensor cores) and embedding lookups are gathers:
neither is counted. Attention adds QKᵀ and AV, 2·s²·H multiply-accumulates per layer for a
sequence of s tokens: 12·L·H·s per token with the backward pass (PaLM's 6N + 12·L·H·S).

Everything is counted on real tokens, never on padding: MFU measures useful work, so padding
lowers it. The same goes for the vocabulary: V is config.vocab_size of the model as saved, the
tokenizer's size (BERT's 30,522), not the rows pretraining pads it to for tensor cores
(pretraining.pad_vocab_to_multiple_of: 30,528); the padded rows' logits are computed and thrown
away, work a faster shape buys but no useful FLOP (throughput.model_shape and bench_pretrain's
useful FLOPs pass the unpadded size; bench_pretrain's hardware FLOPs the padded one).
Heads: the MLM transform and vocabulary projection (H² + H·V) on the predicted
positions only, which is what bertkit's MaskedOnlyBertForPreTraining computes (transformers'
BertForPreTraining projects every position: pass predicted_tokens = every position for it); the
pooler and a 2-way sequence head (NSP or SOP, H² + 2H) once per sequence. Finetuning heads are not
counted: a sequence classifier's H·k (k ≤ 3 labels) per sequence is below the pooler's 1/H, and a
token classifier's H·k per token (NER: k = 9; SQuAD: k = 2) is under 0.01% of BERT-base's
encoder. Activation recomputation (gradient checkpointing) is not counted either: MFU counts the
model's FLOPs, not the hardware's (PaLM, appendix B).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from transformers import BertConfig


def parameter_counts(config: BertConfig) -> dict[str, int]:
    """Parameters per component of BertModel / BertForPreTraining, from the config alone."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    embeddings = (v + config.max_position_embeddings + config.type_vocab_size) * h + 2 * h
    attention = 4 * h * h + 4 * h + 2 * h  # Q, K, V, output; LayerNorm
    feed_forward = 2 * h * i + i + h + 2 * h  # up, down; LayerNorm
    layer = attention + feed_forward
    encoder = config.num_hidden_layers * layer
    pooler = h * h + h
    mlm_head = h * h + h + 2 * h + v  # transform, its LayerNorm, decoder bias (weight tied)
    nsp_head = 2 * h + 2
    bert_model = embeddings + encoder + pooler
    return {"embeddings": embeddings, "layer": layer, "encoder": encoder, "pooler": pooler,
            "mlm_head": mlm_head, "nsp_head": nsp_head, "bert_model": bert_model,
            "pretraining": bert_model + mlm_head + nsp_head}


def matmul_parameters(config: BertConfig) -> int:
    """The encoder's weight-matrix entries, L·(4H² + 2·H·I): Kaplan's N for a BERT."""
    h = config.hidden_size
    return config.num_hidden_layers * (4 * h * h + 2 * h * config.intermediate_size)


def training_flops(config: BertConfig, *, real_tokens: int, sum_squared_lengths: int,
                   predicted_tokens: int, sequences: int, backward: bool = True) -> float:
    """Matmul FLOPs of training on a set of batches (forward and backward), counted on
    real tokens only (see the module's docstring for what is counted and why).

    real_tokens: non-padding tokens; sum_squared_lengths: Σ s² over sequences of s real
    tokens; predicted_tokens: positions the vocabulary head runs on (0 for a finetuning model);
    sequences: sequences through the pooler and a 2-way sequence head (0 for a model without a
    pooler); backward=False: the forward pass alone (a frozen encoder, as in the feature-based
    approach).
    """
    h, v = config.hidden_size, config.vocab_size
    macs = (matmul_parameters(config) * real_tokens
            + 2 * config.num_hidden_layers * h * sum_squared_lengths  # QKᵀ and AV
            + (h * h + h * v) * predicted_tokens  # MLM transform and vocabulary projection
            + (h * h + 2 * h) * sequences)  # pooler and NSP/SOP head
    return float(2 * (3 if backward else 1) * macs)


def flops_per_token(config: BertConfig, seq_len: int, predicted_share: float = 0.15) -> float:
    """Training FLOPs per token for full sequences of seq_len real tokens, predicted_share of
    them predicted (0.15: BERT's masking; 0 for a finetuning model), one pooled sequence each."""
    return training_flops(config, real_tokens=seq_len, sum_squared_lengths=seq_len * seq_len,
                          predicted_tokens=predicted_share * seq_len, sequences=1) / seq_len


def _words(text: str) -> str:
    """Lower case, with runs of spaces, '-' and '_' as one space: 'H100_PCIe' = 'h100 pcie'."""
    return " ".join(part for part in re.split(r"[\s_\-]+", str(text).lower()) if part)


def peak_flops(device_name: str, precision: str,
               table: Mapping[str, Mapping[str, float]]) -> float | None:
    """The dense peak FLOP/s of the device at `precision` (bf16, fp16, tf32, fp32), from
    `table`: device key -> {precision: TFLOP/s} (conf/throughput/default.yaml's peak_tflops).

    A key matches when its words appear in the device name as whole words (case, spaces, '-'
    and '_' aside: "A10" matches "NVIDIA A10" but neither "NVIDIA A100-SXM4-80GB" nor
    "NVIDIA A10G"); the longest matching key wins ("H100 PCIe" over "H100"). None for an
    unknown device (a CPU), or a known one without that precision in its row.
    """
    name = _words(device_name)
    keys = sorted(table, key=lambda key: len(_words(key)), reverse=True)
    for key in keys:
        words = _words(key)
        if words and re.search(rf"(?<![a-z0-9]){re.escape(words)}(?![a-z0-9])", name):
            row = {str(p).lower(): value for p, value in table[key].items()}
            value = row.get(str(precision).lower())
            return None if value is None else float(value) * 1e12
    return None

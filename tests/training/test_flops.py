"""bertkit.training.throughput: the closed-form parameter counts against transformers' models, the
training FLOPs against torch's own FLOP counter on a real model, and the peak table lookups."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForPreTraining, BertModel

from bertkit.pretraining.model import MaskedOnlyBertForPreTraining
from bertkit.training.throughput import (
    flops_per_token,
    parameter_counts,
    peak_flops,
    training_flops,
)
from tests.conftest import compose_config

BASE = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                  num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
                  type_vocab_size=2)
LARGE = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                   num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512,
                   type_vocab_size=2)


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("config", "bert_model"), [(BASE, 109_482_240), (LARGE, 335_141_888)])
def test_parameter_counts_equal_the_models_component_by_component(config, bert_model):
    counts = parameter_counts(config)
    with torch.device("meta"):
        model = BertForPreTraining(config)
        plain = BertModel(config)
    bert, heads = model.bert, model.cls
    assert numel(bert.embeddings) == counts["embeddings"]
    assert numel(bert.encoder.layer[0]) == counts["layer"]
    assert numel(bert.encoder) == counts["encoder"]
    assert numel(bert.pooler) == counts["pooler"]
    # The decoder's weight is the word embeddings (tied): counted once, with the embeddings.
    decoder = heads.predictions.decoder.weight
    assert decoder is bert.embeddings.word_embeddings.weight
    assert numel(heads.predictions) - decoder.numel() == counts["mlm_head"]
    assert numel(heads.seq_relationship) == counts["nsp_head"]
    assert numel(plain) == counts["bert_model"] == bert_model
    assert numel(model) == counts["pretraining"]


def tiny_model() -> MaskedOnlyBertForPreTraining:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=48, max_position_embeddings=64,
                        attn_implementation="eager")
    return MaskedOnlyBertForPreTraining(config)


def counted(model, ids, mask, labels, backward: bool = True) -> int:
    """torch's count of the matmul FLOPs of one step (forward, and backward if asked)."""
    with FlopCounterMode(display=False) as counter:
        output = model(ids, labels=labels, attention_mask=mask,
                       token_type_ids=torch.zeros_like(ids),
                       next_sentence_label=torch.zeros(len(ids), dtype=torch.long))
        if backward:
            output.loss.backward()
    model.zero_grad()
    return counter.get_total_flops()


LENGTHS, PREDICTED = [5, 9, 14], [1, 2, 3]  # real tokens, masked positions of each sequence


def sequences():
    generator = torch.Generator().manual_seed(0)
    for length, predicted in zip(LENGTHS, PREDICTED, strict=True):
        ids = torch.randint(5, 50, (length,), generator=generator)
        labels = torch.full((length,), -100)
        labels[1:1 + predicted] = ids[1:1 + predicted]
        yield ids, labels


@pytest.mark.parametrize("backward", [True, False])
def test_training_flops_equal_torchs_flop_counter_on_real_tokens(backward):
    """FlopCounterMode counts what runs, padding included: run each sequence alone (no padding)
    and the sum is exactly the count on real tokens."""
    model = tiny_model().train()
    measured = sum(counted(model, ids[None], torch.ones(1, len(ids), dtype=torch.long),
                           labels[None], backward) for ids, labels in sequences())
    assert measured == training_flops(
        model.config, real_tokens=sum(LENGTHS), sum_squared_lengths=sum(n * n for n in LENGTHS),
        predicted_tokens=sum(PREDICTED), sequences=len(LENGTHS), backward=backward)


def test_a_padded_batch_computes_more_than_its_real_tokens():
    """The same three sequences padded to 14 in one batch: torch counts every position, i.e.
    training_flops of 3 x 14 tokens; the real-token count, what MFU divides, is lower."""
    model = tiny_model().train()
    width = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    labels = torch.full((len(LENGTHS), width), -100)
    mask = torch.zeros_like(ids)
    for row, (sequence, label) in enumerate(sequences()):
        ids[row, :len(sequence)], labels[row, :len(label)], mask[row, :len(sequence)] = \
            sequence, label, 1
    measured = counted(model, ids, mask, labels)
    assert measured == training_flops(
        model.config, real_tokens=len(LENGTHS) * width,
        sum_squared_lengths=len(LENGTHS) * width * width, predicted_tokens=sum(PREDICTED),
        sequences=len(LENGTHS))
    assert measured > training_flops(
        model.config, real_tokens=sum(LENGTHS), sum_squared_lengths=sum(n * n for n in LENGTHS),
        predicted_tokens=sum(PREDICTED), sequences=len(LENGTHS))


def test_flops_per_token_is_6n_plus_attention_plus_heads():
    h, layers, v = 768, 12, 30522
    n = layers * (4 * h * h + 2 * h * 3072)  # the encoder's weight matrices: 84,934,656
    expected = 6 * n + 12 * layers * h * 128 + 6 * (h * h + h * v) * 0.15 \
        + 6 * (h * h + 2 * h) / 128
    assert flops_per_token(BASE, 128) == pytest.approx(expected, rel=1e-12)
    assert flops_per_token(BASE, 128) / 1e9 == pytest.approx(0.5454, abs=1e-4)
    # At 512 tokens attention is a larger share: 12·L·H·S / 6N = 11.1%.
    assert flops_per_token(BASE, 512, 0.0) > flops_per_token(BASE, 128, 0.0) * 1.08


@pytest.fixture(scope="module")
def table():
    return compose_config([]).throughput.peak_tflops


@pytest.mark.parametrize(("name", "precision", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # SXM5: its name says no form factor
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H100 NVL", "fp16", 835.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
    ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
    ("NVIDIA A10", "bf16", 125.0),
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("nvidia h100 pcie", "BF16", 756.5),
])
def test_peak_flops_of_known_devices(table, name, precision, tflops):
    assert peak_flops(name, precision, table) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(("name", "precision"), [
    ("cpu", "fp32"), ("NVIDIA A10G", "bf16"), ("NVIDIA L40S", "bf16"),
    ("NVIDIA GH200 480GB", "bf16"), ("NVIDIA H100 80GB HBM3", "fp8"), ("Tesla T4", "fp16"),
])
def test_unknown_devices_and_precisions_have_no_peak(table, name, precision):
    assert peak_flops(name, precision, table) is None


def test_the_longest_matching_key_wins_whatever_the_order():
    table = {"H100": {"bf16": 1.0}, "H100 NVL": {"bf16": 2.0}, "H100-PCIe": {"bf16": 3.0}}
    assert peak_flops("NVIDIA H100 NVL", "bf16", table) == 2e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16", table) == 3e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", table) == 1e12
    # The device was recognised but its row lacks the precision: no guess from another row.
    assert peak_flops("NVIDIA H100 NVL", "fp16", table) is None

"""The loss's weighing in one process (bertkit.training.trainer, "The loss on N processes, as on
one"): a micro-batch's mean weighs by its share of the whole batch's items, so gradient
accumulation gives the whole batch's mean, and one process without accumulation is Trainer's
loss to the bit. The same weighing across processes: tests/training/test_process_equivalence.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertForTokenClassification, Trainer, TrainingArguments

from bertkit.training.trainer import PAST_WINDOW, BertkitTrainer, PaddedRows, loss_items
from tests.finetuning.method_fixtures import VOCAB, tiny_config

LENGTH = 12


class TaggedSentences(torch.utils.data.Dataset):
    """Sentences whose labelled tokens vary from 1 to LENGTH: a token-level mean of means
    differs from the mean over every labelled token."""

    def __init__(self, n: int = 32, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, VOCAB, (n, LENGTH), generator=generator)
        self.labels = torch.randint(0, 3, (n, LENGTH), generator=generator)
        labelled = torch.randint(1, LENGTH + 1, (n,), generator=generator)
        self.labels[torch.arange(LENGTH)[None, :] >= labelled[:, None]] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def _train(trainer_class, tmp_path, batch: int, accumulation: int) -> list[tuple[float, float]]:
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_config(num_labels=3, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0))
    args = TrainingArguments(
        output_dir=str(tmp_path / f"{trainer_class.__name__}-{batch}x{accumulation}"),
        max_steps=4, per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation, learning_rate=1e-3, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    trainer = trainer_class(model=model, args=args, train_dataset=TaggedSentences())
    trainer.train()
    return [(line["loss"], line["grad_norm"]) for line in trainer.state.log_history
            if "loss" in line]


def test_accumulation_gives_the_whole_batch_mean(tmp_path):
    whole = _train(BertkitTrainer, tmp_path, batch=8, accumulation=1)
    accumulated = _train(BertkitTrainer, tmp_path, batch=4, accumulation=2)
    assert len(whole) == len(accumulated) == 4
    for (loss, norm), (other_loss, other_norm) in zip(whole, accumulated, strict=True):
        assert other_loss == pytest.approx(loss, rel=1e-5)
        assert other_norm == pytest.approx(norm, rel=1e-5)


def test_one_process_without_accumulation_is_trainers_loss_to_the_bit(tmp_path):
    assert _train(BertkitTrainer, tmp_path, 8, 1) == _train(Trainer, tmp_path, 8, 1)


def test_items_are_the_labels_the_loss_does_not_ignore():
    ids = torch.zeros(3, 5, dtype=torch.long)
    assert loss_items({"input_ids": ids, "labels": torch.tensor([1, -100, 0])},
                      PaddedRows()) == 2
    assert loss_items({"input_ids": ids, "labels": torch.tensor([0.5, float("nan"), 2.0])},
                      PaddedRows({"labels": float("nan")})) == 2
    spans = PaddedRows({"start_positions": PAST_WINDOW, "end_positions": PAST_WINDOW})
    # QA heads clamp positions to [0, width] and ignore `width`: a row past the window.
    assert loss_items({"input_ids": ids, "start_positions": torch.tensor([0, 4, 9])},
                      spans) == 2
    assert loss_items({"input_ids": ids}, PaddedRows()) is None

"""The throughput meter on real tiny runs: what it records equals an independent count of
what was fed (GLUE, SWAG's choices, pretraining's predicted positions), MFU is the FLOPs over
seconds x peak when the device has a peak and null otherwise, and it can be turned off."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from transformers import BertConfig

from bertkit.jobs import run_job
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining
from bertkit.pretraining.run import pretrain
from bertkit.training import throughput
from bertkit.training.models import load_tokenizer
from bertkit.training.throughput import training_flops
from tests.conftest import compose_config, tiny_run_overrides
from tests.pretraining.test_pretrain_recipe import small_run
from tests.tasks.swag.test_swag_recipe import swag_files, swag_overrides  # noqa: F401
from tests.wandb_records import read_offline_run

WINDOW_KEYS = {"throughput/tokens_per_second", "throughput/samples_per_second",
               "throughput/real_token_share", "throughput/peak_memory_gb"}


def one_epoch_of_mrpc(glue_dir, vocab_dir, **extra):
    """24 MRPC pairs, batches of 8 in file order (sequential sampling): one epoch, 3 steps,
    a log line and a checkpoint (with its log history) after each."""
    return compose_config(tiny_run_overrides("mrpc", glue_dir("mrpc"), vocab_dir, **{
        "trainer.max_steps": -1, "trainer.num_train_epochs": 1,
        "trainer.train_sampling_strategy": "sequential", "trainer.save_strategy": "steps",
        "trainer.save_steps": 1, "keep_checkpoints": True, **extra}))


def pair_lengths(cfg) -> list[int]:
    """Real tokens of each training pair, tokenised here from train.tsv, in file order."""
    with open(f"{cfg.task.data_dir}/train.tsv", newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    tokenizer = load_tokenizer(cfg.model)
    return [len(tokenizer(row["#1 String"], row["#2 String"], truncation=True,
                          max_length=cfg.task.max_seq_length)["input_ids"]) for row in rows]


def model_config(run_dir) -> BertConfig:
    return BertConfig.from_json_file(str(run_dir / "model" / "config.json"))


@pytest.mark.slow  # a run
def test_glue_record_counts_exactly_the_tokens_and_samples_fed(glue_dir, vocab_dir, tmp_path):
    cfg = one_epoch_of_mrpc(glue_dir, vocab_dir)
    run_dir = tmp_path / "run"
    record = run_job(cfg, run_dir)["train"]["throughput"]

    lengths = pair_lengths(cfg)
    batches = [lengths[i:i + 8] for i in range(0, len(lengths), 8)]
    assert len(lengths) == 24 and len(batches) == 3
    padded = sum(8 * max(batch) for batch in batches)  # each batch padded to its longest
    assert record["samples"] == record["sequences"] == 24
    assert record["real_tokens"] == sum(lengths)
    assert record["positions"] == padded
    assert record["predicted_tokens"] == 0
    assert record["real_token_share"] == pytest.approx(sum(lengths) / padded)
    assert record["samples_per_second"] * record["seconds"] == pytest.approx(24)
    assert record["tokens_per_second"] * record["seconds"] == pytest.approx(sum(lengths))
    # The encoder on real tokens, the pooler and its head once per pair: no MLM head.
    assert record["flops"] == training_flops(
        model_config(run_dir), real_tokens=sum(lengths),
        sum_squared_lengths=sum(n * n for n in lengths), predicted_tokens=0, sequences=24)
    assert record["device"] == "cpu" and record["precision"] == "fp32"
    assert record["mfu"] is None and record["peak_tflops"] is None
    assert record["peak_memory_gb"] > 0.01  # the process's peak resident set
    assert 0 < record["seconds"] <= json.loads((run_dir / "metrics.json").read_text())[
        "train"]["seconds"]

    # One step per log line: each window's share is its own batch's.
    state = json.loads((run_dir / "checkpoints" / "checkpoint-3" / "trainer_state.json")
                       .read_text())
    lines = [line for line in state["log_history"] if "loss" in line]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line, batch in zip(lines, batches, strict=True):
        assert WINDOW_KEYS <= set(line) and "throughput/mfu" not in line
        assert line["throughput/real_token_share"] == pytest.approx(sum(batch) /
                                                                    (8 * max(batch)))


@pytest.mark.slow  # a run
def test_mfu_divides_by_the_peak_of_a_device_in_the_table(glue_dir, vocab_dir, tmp_path,
                                                         monkeypatch):
    monkeypatch.setattr(throughput, "device_name", lambda device: "NVIDIA Testcard 9000 PCIe")
    cfg = one_epoch_of_mrpc(glue_dir, vocab_dir, **{
        "+throughput.peak_tflops.Testcard_9000": "{fp32: 0.5, bf16: 7.0}",
        "trainer.save_strategy": "no"})
    record = run_job(cfg, tmp_path / "run")["train"]["throughput"]
    # A CPU run computes in fp32: that column's peak.
    assert record["device"] == "NVIDIA Testcard 9000 PCIe" and record["peak_tflops"] == 0.5
    assert record["mfu"] == pytest.approx(record["flops"] / (record["seconds"] * 0.5e12))
    assert 0 < record["mfu"] < 1


@pytest.mark.slow  # a run
def test_disabled_records_nothing_and_logs_nothing(glue_dir, vocab_dir, tmp_path):
    cfg = one_epoch_of_mrpc(glue_dir, vocab_dir, **{"throughput.enabled": False})
    run_dir = tmp_path / "run"
    assert "throughput" not in run_job(cfg, run_dir)["train"]
    state = json.loads((run_dir / "checkpoints" / "checkpoint-3" / "trainer_state.json")
                       .read_text())
    assert not any(key.startswith("throughput/") for line in state["log_history"]
                   for key in line)


@pytest.mark.slow  # a run
def test_swag_counts_examples_and_every_choice(swag_files, tmp_path):  # noqa: F811
    """Multiple choice feeds [batch, 4, length]: a sample is an example, each of its four
    choices a sequence; 40 examples in batches of 8 is one epoch in 5 steps."""
    train, dev = swag_files
    cfg = compose_config(swag_overrides(train, dev, tmp_path, **{
        "trainer.max_steps": 5, "trainer.eval_strategy": "no"}))
    run_dir = tmp_path / "run"
    record = run_job(cfg, run_dir)["train"]["throughput"]

    tokenizer = load_tokenizer(cfg.model)
    with open(train, newline="") as handle:
        rows = list(csv.DictReader(handle))
    lengths = [len(tokenizer(row["sent1"], f"{row['sent2']} {row[f'ending{k}']}",
                             truncation="only_second", max_length=32)["input_ids"])
               for row in rows for k in range(4)]
    assert len(rows) == 40
    assert record["samples"] == 40 and record["sequences"] == 160
    assert record["real_tokens"] == sum(lengths)
    assert record["flops"] == training_flops(
        model_config(run_dir), real_tokens=sum(lengths),
        sum_squared_lengths=sum(n * n for n in lengths), predicted_tokens=0, sequences=160)
    assert record["samples_per_second"] * record["seconds"] == pytest.approx(40)


@pytest.mark.slow  # a pretraining run
def test_pretraining_counts_the_predicted_positions_the_head_ran_on(tmp_path, monkeypatch):
    """The model's own count of the masked positions it projected (its mlm_count) and of the
    real tokens it saw, summed over the training steps, against the record."""
    seen = {"predicted": 0, "real": 0, "squares": 0, "rows": 0}
    forward = MaskedOnlyBertForPreTraining.forward

    def counting_forward(self, input_ids, labels=None, attention_mask=None, **kwargs):
        output = forward(self, input_ids, labels, attention_mask=attention_mask, **kwargs)
        if self.training:  # a batch without padding comes without a mask
            lengths = attention_mask.sum(-1) if attention_mask is not None \
                else torch.full((len(input_ids),), input_ids.shape[1])
            seen["predicted"] += int(output.mlm_count)
            seen["real"] += int(lengths.sum())
            seen["squares"] += int((lengths * lengths).sum())
            seen["rows"] += len(input_ids)
        return output

    monkeypatch.setattr(MaskedOnlyBertForPreTraining, "forward", counting_forward)
    run_dir = tmp_path / "run"
    summary = pretrain(compose_config(small_run()), run_dir)
    record = summary["train"]["throughput"]
    assert seen["rows"] == 8 * 8 and seen["predicted"] > 0
    assert record["samples"] == record["sequences"] == 64
    assert record["predicted_tokens"] == seen["predicted"]
    assert record["real_tokens"] == seen["real"] == summary["train"]["tokens_seen"]
    assert record["flops"] == training_flops(
        model_config(run_dir), real_tokens=seen["real"], sum_squared_lengths=seen["squares"],
        predicted_tokens=seen["predicted"], sequences=64)
    # Every log line carries the window's figures; the share agrees with the trainer's own.
    for line in summary["log"]:
        assert WINDOW_KEYS <= set(line)
        assert line["throughput/real_token_share"] == pytest.approx(line["real_token_share"])


@pytest.mark.slow  # a run
def test_wandb_gets_the_window_curves_and_the_whole_run_in_its_summary(glue_dir, vocab_dir,
                                                                       tmp_path):
    cfg = one_epoch_of_mrpc(glue_dir, vocab_dir, **{"logger": "wandb",
                                                    "trainer.save_strategy": "no"})
    run_dir = tmp_path / "run"
    record = run_job(cfg, run_dir)["train"]["throughput"]
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    summary = read_offline_run(offline)["summary"]
    # Trainer's W&B callback files the log line's keys under train/.
    assert {f"train/{key}" for key in WINDOW_KEYS} <= set(summary)
    assert summary["throughput/tokens_per_second"] == pytest.approx(record["tokens_per_second"])
    assert summary["throughput/device"] == "cpu" and "throughput/mfu" not in summary

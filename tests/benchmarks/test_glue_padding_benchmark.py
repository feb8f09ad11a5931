"""The bench_glue recipe: both ways train on the same examples, and the padding shares are
counted honestly from the batches fed (checked against the lengths computed here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.command import compose_config as compose_benchmark
from benchmarks.glue_padding import JOB, benchmark_glue_padding, pad_to_max_length
from bertkit.errors import BertkitError
from bertkit.jobs import run_job as run_bertkit_job
from bertkit.tasks.glue.data import load_glue_splits
from bertkit.tasks.glue.family import tokenize_splits
from bertkit.training.models import load_tokenizer


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.glue_padding <overrides>` runs."""
    return compose_benchmark("bench_glue", overrides, with_hydra)


def run_job(cfg, run_dir=None) -> dict:
    """What `python -m benchmarks.glue_padding` runs: bertkit's run_job, the
    benchmark's job."""
    return run_bertkit_job(cfg, run_dir, job=JOB)


N_TRAIN, BATCH, WARMUP, STEPS = 24, 8, 1, 3  # the timed steps feed exactly one epoch


def bench_overrides(data_dir, vocab, **extra) -> list[str]:
    overrides = {
        "task": "mrpc",
        "task.data_dir": str(data_dir),
        "model.tokenizer": str(vocab),
        "model.config.hidden_size": 32,
        "model.config.intermediate_size": 64,
        "model.config.num_hidden_layers": 2,
        "model.config.num_attention_heads": 2,
        "bench.steps": STEPS,
        "bench.warmup_steps": WARMUP,
        "bench.batch_size": BATCH,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def example_lengths(cfg) -> list[int]:
    """Token counts of the training examples, from the tokenizer itself."""
    train = load_glue_splits(cfg.task, cfg.data_source)["train"]
    tokenizer = load_tokenizer(cfg.model)
    encoded = tokenizer(list(train["text_a"]), list(train["text_b"]), truncation=True,
                        max_length=cfg.task.max_seq_length)
    return [len(ids) for ids in encoded["input_ids"]]


@pytest.mark.slow
def test_benchmark_compares_plain_and_bertkit_padding(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(bench_overrides(glue_dir("mrpc", n_train=N_TRAIN), vocab_dir,
                                         **{"bench.steady_skip": 1}))
    run_dir = tmp_path / "run"

    result = benchmark_glue_padding(cfg, run_dir=run_dir)

    assert json.loads((run_dir / "bench.json").read_text()) == result
    assert result["task"] == "mrpc" and result["steps"] == STEPS
    assert result["batch_size"] == BATCH and result["warmup_steps"] == WARMUP
    plain, bertkit = result["ways"]["plain"], result["ways"]["bertkit"]
    for way in (plain, bertkit):
        assert way["examples"] == STEPS * BATCH
        assert way["seconds"] > 0
        assert way["samples_per_second"] == pytest.approx(STEPS * BATCH / way["seconds"])
        assert 0 <= way["padding_share"] < 1
    assert result["ratio"] == pytest.approx(
        bertkit["samples_per_second"] / plain["samples_per_second"])
    # The steps after the first steady_skip, timed apart from the run's one-time costs.
    skip = result["steady_skip"]
    assert 0 < skip < STEPS
    for way in (plain, bertkit):
        steady_seconds = BATCH * (STEPS - skip) / way["steady_samples_per_second"]
        assert 0 < steady_seconds < way["seconds"]
    assert result["steady_ratio"] == pytest.approx(
        bertkit["steady_samples_per_second"] / plain["steady_samples_per_second"])
    assert plain["train_sampling_strategy"] == "random"
    # bertkit's batch order is its configured one: run_glue.py's random order by default
    assert bertkit["train_sampling_strategy"] == cfg.trainer.train_sampling_strategy == "random"

    # The timed steps fed every training example once, so both ways saw the same real tokens.
    lengths = example_lengths(cfg)
    assert len(lengths) == N_TRAIN
    assert plain["real_tokens"] == bertkit["real_tokens"] == sum(lengths)
    assert plain["positions"] == N_TRAIN * 128
    assert plain["padding_share"] == pytest.approx(1 - sum(lengths) / (N_TRAIN * 128))
    assert sum(lengths) <= bertkit["positions"] < plain["positions"]
    assert plain["padding_share"] > bertkit["padding_share"]
    assert not (run_dir / "checkpoints").exists()

    # Tokens/s, FLOPs and MFU: the same real tokens, so the same useful FLOPs both ways (the
    # meter counts the real tokens of every batch fed, as the collator's counter does here);
    # no MFU and no per-run memory on a CPU.
    for way in (plain, bertkit):
        assert way["real_tokens_per_second"] == pytest.approx(sum(lengths) / way["seconds"])
        assert way["flops"] > 0 and way["mfu"] is None and way["peak_memory_gb"] is None
    assert plain["flops"] == pytest.approx(bertkit["flops"])
    assert result["device"] == "cpu"


@pytest.mark.slow
def test_only_the_batches_of_the_timed_steps_are_counted(glue_dir, vocab_dir, tmp_path):
    # More examples than the steps take: the batch the loader builds ahead is not counted.
    cfg = compose_config(bench_overrides(glue_dir("mrpc", n_train=40), vocab_dir,
                                         **{"bench.steps": 2, "bench.warmup_steps": 0}))
    result = benchmark_glue_padding(cfg, run_dir=tmp_path / "run")
    for way in result["ways"].values():
        assert way["examples"] == 2 * BATCH
    assert result["ways"]["plain"]["positions"] == 2 * BATCH * 128


def test_plain_features_equal_tokenizer_padding_to_max_length(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(bench_overrides(glue_dir("mrpc", n_train=N_TRAIN), vocab_dir))
    raw = load_glue_splits(cfg.task, cfg.data_source)
    tokenizer = load_tokenizer(cfg.model)
    features = tokenize_splits(raw, tokenizer, max_seq_length=128, cache_dir=tmp_path / "cache")

    padded = pad_to_max_length(features["train"], tokenizer, 128)

    train = raw["train"]
    expected = tokenizer(list(train["text_a"]), list(train["text_b"]), truncation=True,
                         max_length=128, padding="max_length")
    for column in ("input_ids", "token_type_ids", "attention_mask"):
        assert list(padded[column]) == expected[column]


def test_baseline_shorter_than_truncation_is_refused(glue_dir, vocab_dir, tmp_path):
    cfg = compose_config(bench_overrides(glue_dir("mrpc"), vocab_dir,
                                         **{"bench.baseline_max_length": 64}))
    with pytest.raises(BertkitError, match="baseline_max_length=64"):
        benchmark_glue_padding(cfg, run_dir=tmp_path / "run")


@pytest.mark.slow
def test_mfu_of_each_way_on_a_device_with_a_known_peak(glue_dir, vocab_dir, tmp_path,
                                                      monkeypatch):
    """The GPU path's arithmetic on this CPU: a device name the peak table knows (a made-up
    card at 0.5 TFLOP/s fp32) gives each way MFU = its useful FLOPs / (seconds x peak)."""
    from bertkit.training import throughput

    monkeypatch.setattr(throughput, "device_name", lambda device: "NVIDIA Testcard 9000")
    cfg = compose_config(bench_overrides(glue_dir("mrpc", n_train=N_TRAIN), vocab_dir) + [
        "+throughput.peak_tflops.Testcard_9000={fp32: 0.5}"])
    result = benchmark_glue_padding(cfg, run_dir=tmp_path / "run")
    for way in result["ways"].values():
        assert way["mfu"] == pytest.approx(way["flops"] / (way["seconds"] * 0.5e12))
        assert 0 < way["mfu"] < 1

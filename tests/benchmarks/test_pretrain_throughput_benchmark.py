"""The bench_pretrain recipe: both ways train the same steps on the same instances (counted
here from the pipeline's own instances), from the same initial weights; the plain way's padding
is to max_seq_length; the ratios and MFU follow from the recorded figures."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch.nn import functional
from transformers import BertForPreTraining, set_seed

from benchmarks import pretrain_throughput
from benchmarks.command import compose_config as compose_benchmark
from benchmarks.pretrain_throughput import (
    JOB,
    RESULT_FILE,
    PlainBertForPreTraining,
    benchmark_pretrain_throughput,
    plain_model,
    training_indices,
)
from bertkit.errors import BertkitError
from bertkit.jobs import run_job as run_bertkit_job
from bertkit.pretraining.corpora import ensure_demo_corpus
from bertkit.pretraining.model import load_pretraining_model
from bertkit.training.models import load_tokenizer
from bertkit.training.throughput import training_flops
from tests.benchmarks.test_pretrain_data_benchmark import pipeline_lengths


def compose_config(overrides: list[str], with_hydra: bool = False):
    """The config `python -m benchmarks.pretrain_throughput <overrides>` runs."""
    return compose_benchmark("bench_pretrain", overrides, with_hydra)


def run_job(cfg, run_dir=None) -> dict:
    """What `python -m benchmarks.pretrain_throughput` runs: bertkit's run_job, the
    benchmark's job."""
    return run_bertkit_job(cfg, run_dir, job=JOB)


BATCH, STEPS, WARMUP, REPEATS, MAX_LENGTH = 8, 3, 1, 2, 128


def bench_overrides(tmp_path, **extra) -> list[str]:
    overrides = {
        "cache_dir": str(tmp_path / "cache"),
        "corpus.synthetic.num_documents": 40,
        # The demo corpus's own whole-word vocabulary, written beside it.
        "model.tokenizer": str(tmp_path / "cache" / "pretrain_demo"),
        "model.config.hidden_size": 32,
        "model.config.intermediate_size": 64,
        "model.config.num_hidden_layers": 2,
        "model.config.num_attention_heads": 2,
        "bench.steps": STEPS,
        "bench.warmup_steps": WARMUP,
        "bench.repeats": REPEATS,
        "bench.batch_size": BATCH,
        "bench.eval_instances": 2 * BATCH,
        **extra,
    }
    return [f"{key}={value}" for key, value in overrides.items()]


def instance_lengths(cfg, cache_dir) -> list[int]:
    """The instances recipe=pretrain trains on, built here in a cache of our own."""
    ensure_demo_corpus(cfg.corpus.files[0], dict(cfg.corpus.synthetic))
    return pipeline_lengths(cfg, cache_dir, MAX_LENGTH)[1]


# With dataloader workers (what a GPU needs, the collator then runs in other processes) the
# batches are counted as without them.
@pytest.mark.slow
@pytest.mark.parametrize("objective, workers", [("mlm_nsp", 0), ("mlm", 0), ("mlm_nsp", 2)])
def test_both_ways_train_the_same_steps_on_the_same_instances(objective, workers, tmp_path):
    cfg = compose_config(bench_overrides(tmp_path, objective=objective,
                                         **{"trainer.dataloader_num_workers": workers}))
    run_dir = tmp_path / "run"

    result = run_job(cfg, run_dir)

    assert json.loads((run_dir / RESULT_FILE).read_text()) == result
    lengths = instance_lengths(cfg, tmp_path / "independent")
    assert result["instances"] == len(lengths) > STEPS * BATCH
    assert result["instance_tokens"] == sum(lengths)
    fed = training_indices(len(lengths), STEPS * BATCH, cfg.seed)
    real_tokens = sum(lengths[i] for i in fed)
    plain, bertkit = result["ways"]["plain"], result["ways"]["bertkit"]
    for way in (plain, bertkit):
        assert way["sequences"] == STEPS * BATCH
        assert way["real_tokens"] == real_tokens
        assert way["sum_squared_lengths"] == sum(lengths[i] ** 2 for i in fed)
        assert len(way["seconds_each_repeat"]) == REPEATS
        assert way["seconds"] > 0 and way["peak_memory_bytes"] > 0
        assert way["samples_per_second"] == pytest.approx(STEPS * BATCH / way["seconds"])
        assert way["real_tokens_per_second"] == pytest.approx(real_tokens / way["seconds"])
        assert 0 < way["masked_tokens"] < real_tokens
        assert 0 < way["mlm_loss"] < 20 and way["training_loss"] > 0
        assert way["mfu"] is None and way["hfu"] is None  # a CPU: no peak to divide by
    # The plain way pads every instance to max_seq_length; bertkit each batch to its longest.
    assert plain["positions"] == STEPS * BATCH * MAX_LENGTH
    assert plain["sum_squared_widths"] == STEPS * BATCH * MAX_LENGTH ** 2
    assert plain["real_token_share"] == pytest.approx(real_tokens / (STEPS * BATCH * MAX_LENGTH))
    assert real_tokens <= bertkit["positions"] <= plain["positions"]
    assert bertkit["real_token_share"] == pytest.approx(real_tokens / bertkit["positions"])
    # The plain model's head runs on every position, bertkit's on the masked ones; the FLOPs
    # counted here from the batches are those the throughput meter counted in the model.
    assert bertkit["flops"] < plain["flops"] < plain["hardware_flops"]
    assert bertkit["flops"] <= bertkit["hardware_flops"]
    for way in (plain, bertkit):
        assert way["meter"]["flops"] == pytest.approx(way["flops"])
        assert way["meter"]["real_tokens"] == real_tokens
    for key in ("samples_per_second", "real_tokens_per_second"):
        assert result["ratio"][key] == pytest.approx(bertkit[key] / plain[key])
    assert (result["device"], result["precision"], result["peak_flops"]) == ("cpu", "fp32", None)
    assert result["steps"] == STEPS and result["batch_size"] == BATCH
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.slow
def test_mfu_is_useful_flops_over_seconds_times_the_peak(tmp_path, monkeypatch):
    asked = []

    def fake_peak(device_name, precision, table):
        asked.append((device_name, precision))
        return 2e12

    monkeypatch.setattr(pretrain_throughput, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(pretrain_throughput, "peak_flops", fake_peak)
    cfg = compose_config(bench_overrides(tmp_path, **{"bench.repeats": 1, "bench.steps": 4,
                                                      "bench.steady_skip": 1}))

    result = benchmark_pretrain_throughput(cfg, run_dir=tmp_path / "run")

    assert asked == [("NVIDIA H100 80GB HBM3", "fp32")]
    assert result["peak_flops"] == 2e12
    config = load_pretraining_model(cfg.model, load_tokenizer(cfg.model)).config
    for name, way in result["ways"].items():
        counts = {key: way[key] for key in ("real_tokens", "sum_squared_lengths", "sequences")}
        head = way["masked_tokens"] if name == "bertkit" else way["real_tokens"]
        flops = training_flops(config, **counts, predicted_tokens=head)
        assert way["flops"] == pytest.approx(flops)
        assert way["mfu"] == pytest.approx(flops / (way["seconds"] * 2e12))
        assert way["hfu"] == pytest.approx(way["hardware_flops"] / (way["seconds"] * 2e12))
        # The steady figures: the 3 steps after the first, timed apart (shorter than the run).
        steady_seconds = way["sequences"] * 3 / 4 / way["steady_samples_per_second"]
        assert 0 < steady_seconds < way["seconds"]
        assert way["steady_mfu"] == pytest.approx(flops * 3 / 4 / (steady_seconds * 2e12))
    assert result["steady_skip"] == 1
    assert result["ratio"]["steady_samples_per_second"] == pytest.approx(
        result["ways"]["bertkit"]["steady_samples_per_second"]
        / result["ways"]["plain"]["steady_samples_per_second"])
    assert "steady MFU" in pretrain_throughput.table(result)


def test_training_indices_feed_every_instance_equally_often():
    for n, count in ((10, 25), (10, 10), (30, 7)):
        indices = training_indices(n, count, seed=3)
        assert len(indices) == count
        times = Counter(indices)
        assert set(times.values()) <= {count // n, count // n + 1}
        assert len(times) == min(n, count)
    assert training_indices(30, 7, seed=3) == training_indices(30, 7, seed=3)


def test_the_plain_model_starts_from_bertkits_weights_with_transformers_loss(tmp_path):
    cfg = compose_config(bench_overrides(tmp_path))
    ensure_demo_corpus(cfg.corpus.files[0], dict(cfg.corpus.synthetic))
    tokenizer = load_tokenizer(cfg.model)
    set_seed(cfg.seed)
    reference = load_pretraining_model(cfg.model, tokenizer)
    model = plain_model(cfg.model, tokenizer, reference.state_dict())
    assert isinstance(model, BertForPreTraining)
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key

    model.eval()
    ids = torch.randint(5, len(tokenizer), (2, 9))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    sentence = torch.tensor([0, 1])
    with torch.no_grad():
        full = BertForPreTraining.forward(model, ids, labels=labels, next_sentence_label=sentence)
        assert model(ids, labels=labels, next_sentence_label=sentence).loss == full.loss
        alone = model(ids, labels=labels).loss  # objective=mlm: transformers gives no loss
    logits = full.prediction_logits
    assert alone == pytest.approx(float(functional.cross_entropy(
        logits.view(-1, logits.shape[-1]), labels.view(-1))))
    assert isinstance(model, PlainBertForPreTraining)


@pytest.mark.parametrize(("override", "message"), [
    ("masking=static", "masking=dynamic"),
    ("pretraining.long_phase.fraction=0.1", "long_phase.fraction=0"),
    ("bench.steps=0", r"^bench\.steps=0: expected a number >= 1$"),  # the range, first
])
def test_settings_the_comparison_cannot_use_are_refused(override, message, tmp_path):
    cfg = compose_config([*bench_overrides(tmp_path), override])
    with pytest.raises(BertkitError, match=message):
        benchmark_pretrain_throughput(cfg, run_dir=tmp_path / "run")
